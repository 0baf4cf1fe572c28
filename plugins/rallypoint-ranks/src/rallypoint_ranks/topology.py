"""The ``topology`` rank strategy: ranks follow the physical layout, and stay put on re-rendezvous.

torchrun orders nodes by host name as a string (``node66`` before ``node7``), ignores where the
nodes are, and shuffles ranks when membership changes. ``topology`` orders nodes by their
labels (zone, switch, rack...), then by host name in natural order, so that neighbouring ranks
(ring neighbours) are physically close and each host's ranks are contiguous; after a
re-rendezvous, surviving nodes keep their relative order and, where possible, their ranks.

The exact rule is :meth:`TopologyStrategy.assign`'s; ``docs/ranks.md`` explains it with examples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from rallypoint.agent.node import parse_node_labels
from rallypoint.agent.ranks import RankAssignment, RankNode, assign_blocks
from rallypoint_ranks.common import (
    LABEL_NAME_RE,
    NaturalKey,
    RankStrategyError,
    describe_node,
    is_pattern,
    natural_key,
)

__all__ = ["TopologyError", "TopologyOptions", "TopologyStrategy", "effective_labels", "topology_order"]

NAME = "topology"
HOST = "host"


class TopologyError(RankStrategyError):
    """The ``topology`` strategy cannot order the nodes (a missing or conflicting label)."""

    def __init__(self, detail: str, *, host: str | None = None, entry: str | None = None) -> None:
        super().__init__(NAME, detail, host=host, entry=entry)


def _check_label_name(name: str) -> str:
    if not LABEL_NAME_RE.match(name):
        raise ValueError(
            f"invalid label name {name!r}: use letters, digits, '_', '.' and '-', starting with a letter or '_'"
        )
    return name


#: ``hosts`` in the job file's schema: each value a table of labels or a ``"rack=a,zone=z1"`` string.
_HOSTS_SCHEMA = {
    "type": "object",
    "additionalProperties": {
        "anyOf": [{"type": "object", "additionalProperties": {"type": "string"}}, {"type": "string"}],
    },
}


class TopologyOptions(BaseModel):
    """``[ranks.options]`` of the ``topology`` strategy.

    Attributes:
        order: label names to sort by, coarsest first. The host name (natural order) always
            comes after them; it may be written as a final ``"host"``.
        hosts: labels per host name or glob pattern, e.g. ``{"gpu-a*": {"rack": "a"}}``; a
            value may also be a string such as ``"rack=a,zone=z1"``. They override the labels
            the node published.
        missing: what a node without one of the ``order`` labels gets: ``"last"`` sorts it after
            the nodes that have the label (at that level); ``"error"`` refuses it.
        stable: keep surviving nodes' order (and, where possible, ranks) across re-rendezvous;
            ``false`` sorts every round afresh.
    """

    model_config = ConfigDict(extra="forbid")

    order: list[str] = Field(default_factory=lambda: ["zone", "switch", "rack"])
    hosts: Annotated[dict[str, dict[str, str]], WithJsonSchema(_HOSTS_SCHEMA)] = Field(default_factory=dict)
    missing: Literal["last", "error"] = "last"
    stable: bool = True

    @field_validator("order")
    @classmethod
    def _check_order(cls, order: list[str]) -> list[str]:
        seen: set[str] = set()
        for index, name in enumerate(order):
            if name in seen:
                raise ValueError(f"label {name!r} appears twice")
            seen.add(name)
            if name == HOST and index != len(order) - 1:
                raise ValueError(f"{HOST!r} must be the last entry: the host name is always the finest level")
            _check_label_name(name)
        return order

    @field_validator("hosts", mode="before")
    @classmethod
    def _parse_label_strings(cls, hosts: Any) -> Any:
        if not isinstance(hosts, Mapping):
            return hosts
        out: dict[Any, Any] = {}
        for key, value in hosts.items():
            if isinstance(value, str):
                value = parse_node_labels(value, source=f"ranks.options.hosts.{key}")
            elif isinstance(value, Mapping):
                for name in value:
                    if isinstance(name, str):
                        _check_label_name(name)
            out[key] = value
        return out

    @property
    def label_order(self) -> tuple[str, ...]:
        """:attr:`order` without a trailing ``"host"``."""
        return tuple(name for name in self.order if name != HOST)


def effective_labels(node: RankNode, options: TopologyOptions) -> dict[str, str]:
    """The labels ``topology`` sorts ``node`` by.

    Start from the labels the node published (:attr:`RankNode.labels`); apply every
    ``hosts`` pattern entry matching the host, in the order written; then the exact host entry.
    Later sources override earlier ones label by label.

    Examples:
        >>> node = RankNode(node_id="n", group_rank=0, host="gpu-a3", local_world_size=1,
        ...                 labels={"rack": "r1", "zone": "z1"})
        >>> options = TopologyOptions(hosts={"gpu-a*": {"rack": "a"}, "gpu-a3": {"zone": "z9"}})
        >>> effective_labels(node, options)
        {'rack': 'a', 'zone': 'z9'}
    """
    labels = dict(node.labels)
    for key, extra in options.hosts.items():
        if is_pattern(key) and fnmatchcase(node.host, key):
            labels.update(extra)
    labels.update(options.hosts.get(node.host, {}))
    return labels


def _label_keys(nodes: Sequence[RankNode], options: TopologyOptions) -> dict[str, tuple[Any, ...]]:
    """Each node's sort key over the ``order`` labels, checked for missing and per-host conflicts."""
    order = options.label_order
    keys: dict[str, tuple[Any, ...]] = {}
    by_host: dict[str, tuple[RankNode, dict[str, str]]] = {}
    for node in sorted(nodes, key=lambda n: n.node_id):
        labels = effective_labels(node, options)
        parts: list[tuple[int, NaturalKey | None]] = []
        for name in order:
            value = labels.get(name)
            if value is None:
                if options.missing == "error":
                    raise TopologyError(
                        f"{describe_node(node)} has no label {name!r} (order {list(order)}, missing = 'error'); "
                        f"set it with RALLYPOINT_NODE_LABELS on the node, in its labels file, or in "
                        f"[ranks.options.hosts]",
                        host=node.host,
                        entry=name,
                    )
                parts.append((1, None))
            else:
                parts.append((0, natural_key(value)))
        first = by_host.setdefault(node.host, (node, labels))
        for name in order:
            if first[1].get(name) != labels.get(name):
                raise TopologyError(
                    f"nodes {first[0].node_id!r} and {node.node_id!r} on host {node.host!r} have different "
                    f"{name!r} labels ({first[1].get(name)!r} and {labels.get(name)!r}); a host is in one place",
                    host=node.host,
                    entry=name,
                )
        keys[node.node_id] = tuple(parts)
    return keys


def topology_order(nodes: Sequence[RankNode], options: TopologyOptions | None = None) -> list[RankNode]:
    """The nodes in ``topology`` order: the order in which they get consecutive blocks of ranks.

    See :meth:`TopologyStrategy.assign` for the rule.

    Raises:
        TopologyError: a node lacks a label with ``missing = "error"``, or two nodes on one host
            have different labels.
    """
    options = options or TopologyOptions()
    label_keys = _label_keys(nodes, options)

    def key(node: RankNode) -> tuple[Any, ...]:
        return (label_keys[node.node_id], natural_key(node.host), node.node_id)

    if not options.stable or all(n.previous_rank is None for n in nodes):
        return sorted(nodes, key=key)

    survivors = sorted(
        (n for n in nodes if n.previous_rank is not None),
        key=lambda n: (n.previous_rank, key(n)),
    )
    newcomers = sorted((n for n in nodes if n.previous_rank is None), key=key)
    order: list[RankNode] = []
    cursor = 0
    for survivor in survivors:
        hole = (survivor.previous_rank or 0) - cursor
        index = 0
        while hole > 0 and index < len(newcomers):
            if newcomers[index].local_world_size <= hole:
                newcomer = newcomers.pop(index)
                order.append(newcomer)
                cursor += newcomer.local_world_size
                hole -= newcomer.local_world_size
            else:
                index += 1
        order.append(survivor)
        cursor += survivor.local_world_size
    order.extend(newcomers)
    return order


class TopologyStrategy:
    """``[ranks] strategy = "topology"``: ranks follow labels, then natural host-name order.

    The rule, applied identically by every agent:

    1. **Labels.** A node's labels are the ones it published (its labels file, overridden by
       its ``RALLYPOINT_NODE_LABELS``), overridden by the ``hosts`` entries of the options
       that match its host name: glob patterns in the order written, then the exact name.
    2. **Topology key.** For each label named in ``order`` (coarsest first), the label's value
       in natural order (``r2`` before ``r10``); a node without the label sorts after those
       with it (``missing = "last"``) or is an error (``missing = "error"``). Then the host
       name in natural order (``node7`` before ``node66``), then the node id. Nodes on the
       same host must have the same labels, so each host's nodes are adjacent.
    3. **First round** (or ``stable = false``, or no node has a previous rank): nodes sorted
       by topology key.
    4. **Re-rendezvous** (``stable = true`` and some node has a
       :attr:`~rallypoint.agent.ranks.RankNode.previous_rank`): *survivors* (nodes with a
       previous rank) keep their relative order, sorted by previous rank (topology key on a
       tie); *newcomers* are sorted by topology key. Walking the survivors in that order with
       a cursor starting at 0: when a survivor's previous rank is above the cursor, the gap is
       a *hole* left by departed nodes; it is filled with the first newcomers (in topology
       order) whose local world size still fits in what is left of the hole; then the survivor
       is placed. The newcomers left over go at the end, in topology order.
    5. **Ranks.** Nodes get consecutive blocks of global ranks in that order, local ranks in
       order within a node; role ranks follow global-rank order within each role.
       ``GROUP_RANK`` stays the rendezvous's.

    So a survivor keeps its ranks exactly when what precedes it adds up to its previous rank:
    always when nodes only join (they are appended), when a departed node is replaced by one
    of the same size, and for every node before the first hole when nodes only leave.
    """

    name = NAME

    def assign(self, nodes: Sequence[RankNode], options: TopologyOptions | None = None) -> RankAssignment:
        """Assign ranks by topology; ``options`` default to :class:`TopologyOptions` ``()``."""
        return assign_blocks(topology_order(nodes, options))
