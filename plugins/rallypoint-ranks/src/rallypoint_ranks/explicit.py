"""The ``explicit`` rank strategy: the job file says which host gets which ranks.

``[ranks.options.hosts]`` maps a host name (or a glob pattern) either to a *node rank* (the
node's position: nodes get consecutive blocks of global ranks in node-rank order) or to the
*global ranks of each of its local workers*. Everything is checked against the nodes that
joined: gaps, duplicates, hosts without an entry, entries without a host and lists of the wrong
length are errors naming the host and the entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from rallypoint.agent.ranks import RankAssignment, RankNode, assign_blocks, assign_ranks
from rallypoint_ranks.common import (
    RankStrategyError,
    describe_node,
    match_host,
    natural_key,
)

__all__ = ["ExplicitError", "ExplicitOptions", "ExplicitStrategy"]

NAME = "explicit"
KEY = "ranks.options.hosts"

Rank = Annotated[StrictInt, Field(ge=0)]


class ExplicitError(RankStrategyError):
    """The ``explicit`` map does not fit the nodes that joined."""

    def __init__(self, detail: str, *, host: str | None = None, entry: str | None = None) -> None:
        super().__init__(NAME, detail, host=host, entry=entry)


def _missing(used: set[int], size: int) -> str:
    gaps = sorted(set(range(size)) - used)
    shown = ", ".join(map(str, gaps[:10])) + (", ..." if len(gaps) > 10 else "")
    return f"; ranks given to nobody: {shown}" if gaps else ""


class ExplicitOptions(BaseModel):
    """``[ranks.options]`` of the ``explicit`` strategy.

    Attributes:
        hosts: host name or glob pattern (``*``, ``?``, ``[0-9]``) to either a node rank
            (``"node7" = 0``) or the global rank of each local worker, in local-rank order
            (``"node7" = [0, 2, 4, 6]``). All entries use the same form. An exact host name
            wins over patterns; a host matching several patterns is an error.
    """

    model_config = ConfigDict(extra="forbid")

    hosts: dict[str, Rank | Annotated[list[Rank], Field(min_length=1)]] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_entries(self) -> ExplicitOptions:
        items = list(self.hosts.items())
        first_key, first_value = items[0]
        for key, value in items[1:]:
            if isinstance(value, list) != isinstance(first_value, list):
                raise ValueError(
                    f"entry {key!r} is {'a list of global ranks' if isinstance(value, list) else 'a node rank'} "
                    f"but entry {first_key!r} is {'a list' if isinstance(first_value, list) else 'a node rank'}; "
                    f"use one form for every entry of {KEY}"
                )
        owner: dict[int, str] = {}
        for key, value in items:
            for rank in value if isinstance(value, list) else [value]:
                if rank in owner:
                    what = "global rank" if isinstance(value, list) else "node rank"
                    if owner[rank] == key:
                        raise ValueError(f"{what} {rank} appears twice in entry {key!r}")
                    raise ValueError(f"{what} {rank} is given by both entries {owner[rank]!r} and {key!r}")
                owner[rank] = key
        return self

    @property
    def form(self) -> Literal["node", "worker"]:
        """``"node"`` when the entries are node ranks, ``"worker"`` when they are lists of global ranks."""
        return "worker" if isinstance(next(iter(self.hosts.values())), list) else "node"


def _ordered(nodes: Sequence[RankNode]) -> list[RankNode]:
    """The nodes in natural host-name order: the order in which problems are reported."""
    return sorted(nodes, key=lambda n: (natural_key(n.host), n.node_id))


def _match(nodes: Sequence[RankNode], options: ExplicitOptions) -> dict[str, str]:
    """Node id to the entry that applies to it; every node has one and every entry is used."""
    entries = options.hosts
    matched: dict[str, str] = {}
    for node in _ordered(nodes):
        keys = match_host(node.host, entries)
        if not keys:
            raise ExplicitError(
                f"{describe_node(node)} matches no entry of {KEY} (entries: {', '.join(map(repr, entries))}); "
                f"add an entry for it",
                host=node.host,
            )
        if len(keys) > 1:
            raise ExplicitError(
                f"{describe_node(node)} matches several entries of {KEY}: {', '.join(map(repr, keys))}; "
                f"add an exact entry for it or make the patterns disjoint",
                host=node.host,
                entry=keys[0],
            )
        matched[node.node_id] = keys[0]
    used = set(matched.values())
    hosts = sorted({n.host for n in nodes}, key=natural_key)
    for key in entries:
        if key not in used:
            raise ExplicitError(
                f"entry {key!r} of {KEY} applies to no host that joined (hosts: {', '.join(map(repr, hosts))}); "
                f"remove it, or wait for that host to join",
                entry=key,
            )
    return matched


def _node_form(nodes: Sequence[RankNode], options: ExplicitOptions, matched: dict[str, str]) -> RankAssignment:
    """Node ranks: exactly ``0..G-1``; nodes take contiguous blocks of ranks in node-rank order."""
    by_id = {n.node_id: n for n in nodes}
    count = len(nodes)
    node_rank: dict[str, int] = {}
    owner: dict[int, str] = {}
    for node in _ordered(nodes):
        key = matched[node.node_id]
        value = options.hosts[key]
        assert isinstance(value, int)  # form == "node"
        if value in owner:
            other = by_id[owner[value]]
            raise ExplicitError(
                f"node rank {value} is given to both {describe_node(other)} (entry "
                f"{matched[other.node_id]!r}) and {describe_node(node)} (entry {key!r})",
                host=node.host,
                entry=key,
            )
        owner[value] = node.node_id
        node_rank[node.node_id] = value
    for node in _ordered(nodes):
        value = node_rank[node.node_id]
        if value >= count:
            raise ExplicitError(
                f"{describe_node(node)}: entry {matched[node.node_id]!r} gives node rank {value}, but node "
                f"ranks must be 0..{count - 1} ({count} node(s) joined){_missing(set(owner), count)}",
                host=node.host,
                entry=matched[node.node_id],
            )
    return assign_blocks(sorted(nodes, key=lambda n: node_rank[n.node_id]))


def _worker_form(nodes: Sequence[RankNode], options: ExplicitOptions, matched: dict[str, str]) -> RankAssignment:
    """Global ranks per worker: one per local worker, together exactly ``0..N-1``."""
    world_size = sum(n.local_world_size for n in nodes)
    ranks: dict[str, list[int]] = {}
    owners: dict[int, tuple[RankNode, int]] = {}
    for node in _ordered(nodes):
        key = matched[node.node_id]
        value = options.hosts[key]
        assert isinstance(value, list)  # form == "worker"
        if len(value) != node.local_world_size:
            raise ExplicitError(
                f"{describe_node(node)}: entry {key!r} lists {len(value)} global rank(s) but the node runs "
                f"{node.local_world_size} worker(s) (local_world_size); give one rank per local worker",
                host=node.host,
                entry=key,
            )
        for local_rank, rank in enumerate(value):
            if rank in owners:
                other, other_local = owners[rank]
                raise ExplicitError(
                    f"global rank {rank} is given to both {describe_node(other)} local rank {other_local} "
                    f"(entry {matched[other.node_id]!r}) and {describe_node(node)} local rank {local_rank} "
                    f"(entry {key!r})",
                    host=node.host,
                    entry=key,
                )
            owners[rank] = (node, local_rank)
        ranks[node.node_id] = list(value)
    for node in _ordered(nodes):
        for local_rank, rank in enumerate(ranks[node.node_id]):
            if rank >= world_size:
                raise ExplicitError(
                    f"{describe_node(node)} local rank {local_rank}: entry {matched[node.node_id]!r} gives global "
                    f"rank {rank}, but global ranks must be 0..{world_size - 1} (world size {world_size})"
                    f"{_missing(set(owners), world_size)}",
                    host=node.host,
                    entry=matched[node.node_id],
                )
    return assign_ranks(nodes, ranks)


class ExplicitStrategy:
    """``[ranks] strategy = "explicit"``: ranks from a map in ``[ranks.options.hosts]``.

    * **Node ranks** (``"node7" = 0``): the node ranks must be exactly ``0..G-1`` over the
      ``G`` nodes that joined; nodes get consecutive blocks of global ranks in node-rank order
      (local ranks in order within a node).
    * **Global ranks per worker** (``"node7" = [0, 2, 4, 6]``): each list has one rank per
      local worker (its length is the node's local world size) and together they are exactly
      ``0..N-1``; a node's ranks need not be contiguous.

    ``GROUP_RANK`` stays the rendezvous's; role ranks follow global-rank order within each role.
    Unknown hosts, unused entries, gaps, duplicates and wrong list lengths raise
    :class:`ExplicitError` naming the host and the entry.
    """

    name = NAME

    def assign(self, nodes: Sequence[RankNode], options: ExplicitOptions | None) -> RankAssignment:
        """Assign the ranks the map gives."""
        if options is None:
            raise ExplicitError(f'it needs a map of host to ranks in [{KEY}], e.g. "node7" = 0')
        matched = _match(nodes, options)
        if options.form == "node":
            return _node_form(nodes, options, matched)
        return _worker_form(nodes, options, matched)
