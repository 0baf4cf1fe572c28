"""The ``env`` rank strategy: keep the ranks a scheduler already gave (Slurm, Open MPI, torch-style).

Each agent publishes its scheduler variables in the rendezvous (:attr:`RankNode.env
<rallypoint.agent.ranks.RankNode.env>`), so every agent sees every node's and checks them for
consistency across nodes before trusting them: one variable family everywhere, one world size,
no rank given twice, no gap. Any conflict is an :class:`EnvRanksError` naming the host and the
variable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rallypoint.agent.ranks import RankAssignment, RankNode, assign_blocks
from rallypoint_ranks.common import (
    RankStrategyError,
    describe_node,
    natural_key,
)

__all__ = ["FAMILIES", "EnvOptions", "EnvRanksError", "EnvStrategy", "Family"]

NAME = "env"


class EnvRanksError(RankStrategyError):
    """The scheduler's variables are missing, malformed or inconsistent across nodes."""

    def __init__(self, detail: str, *, host: str | None = None, entry: str | None = None) -> None:
        super().__init__(NAME, detail, host=host, entry=entry)


@dataclass(frozen=True)
class Family:
    """The variables one kind of scheduler sets.

    Attributes:
        name: the ``source`` option value selecting it.
        rank: the task's rank.
        local_rank: the task's rank on its host.
        size: the number of tasks; the first of these that is set is used.
    """

    name: str
    rank: str
    local_rank: str
    size: tuple[str, ...]

    def complete(self, node: RankNode) -> bool:
        """Whether ``node`` published this family's rank and size."""
        return self.rank in node.env and self.size_variable(node) is not None

    def size_variable(self, node: RankNode) -> str | None:
        """The size variable ``node`` published, if any."""
        return next((v for v in self.size if v in node.env), None)


#: The families ``env`` understands, in the order ``source = "auto"`` prefers them.
FAMILIES: tuple[Family, ...] = (
    Family("torch", "RANK", "LOCAL_RANK", ("WORLD_SIZE",)),
    Family("slurm", "SLURM_PROCID", "SLURM_LOCALID", ("SLURM_NTASKS", "SLURM_NPROCS")),
    Family("ompi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", ("OMPI_COMM_WORLD_SIZE",)),
)
_BY_NAME = {f.name: f for f in FAMILIES}


class EnvOptions(BaseModel):
    """``[ranks.options]`` of the ``env`` strategy.

    Attributes:
        source: which variables to read: ``"torch"`` (``RANK``, ``LOCAL_RANK``,
            ``WORLD_SIZE``), ``"slurm"`` (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``
            or ``SLURM_NPROCS``), ``"ompi"`` (``OMPI_COMM_WORLD_RANK``,
            ``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_SIZE``), or ``"auto"``: the one
            family every node has (torch, then slurm, then ompi), refusing families that
            disagree.
        level: what the scheduler's tasks are: ``"node"``, one task per node (rank = node
            index, size = number of nodes); ``"worker"``, one task per worker, the agent running
            in its node's first (rank = global rank of the node's first worker, size = world
            size); ``"auto"``: ``node`` when the size is the number of nodes, else ``worker``
            when it is the world size.
    """

    model_config = ConfigDict(extra="forbid")

    source: Literal["auto", "torch", "slurm", "ompi"] = "auto"
    level: Literal["auto", "node", "worker"] = "auto"


@dataclass(frozen=True)
class _Task:
    node: RankNode
    rank: int
    size: int
    local_rank: int | None
    rank_var: str
    size_var: str


def _int(node: RankNode, variable: str) -> int:
    text = node.env[variable]
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise EnvRanksError(
            f"{describe_node(node)}: {variable}={text!r} is not a non-negative integer", host=node.host, entry=variable
        )
    return value


def _ordered(nodes: Sequence[RankNode]) -> list[RankNode]:
    return sorted(nodes, key=lambda n: (natural_key(n.host), n.node_id))


def _family(nodes: Sequence[RankNode], source: str) -> Family:
    """The family to read: the one asked for, or the one ``auto`` finds on every node."""
    ordered = _ordered(nodes)
    if source != "auto":
        family = _BY_NAME[source]
        for node in ordered:
            if not family.complete(node):
                lacking = family.rank if family.rank not in node.env else " or ".join(family.size)
                raise EnvRanksError(
                    f"{describe_node(node)} has no {lacking} (source = {source!r}); start the agent under the "
                    f"scheduler on every node, or choose another source",
                    host=node.host,
                    entry=lacking,
                )
        return family
    everywhere = [f for f in FAMILIES if all(f.complete(n) for n in ordered)]
    if not everywhere:
        for node in ordered:
            if not any(f.complete(node) for f in FAMILIES):
                wanted = "; ".join(f"{f.rank} and {' or '.join(f.size)}" for f in FAMILIES)
                raise EnvRanksError(
                    f"{describe_node(node)} has no scheduler ranks (looked for: {wanted}); start the agent under "
                    f"the scheduler on every node, or use another rank strategy",
                    host=node.host,
                )
        found = ", ".join(f"{describe_node(n)}: {'+'.join(f.name for f in FAMILIES if f.complete(n))}" for n in ordered)
        raise EnvRanksError(f"the nodes have scheduler ranks from different schedulers ({found}); no one source")
    chosen = everywhere[0]
    for other in everywhere[1:]:
        for node in ordered:
            mine = (node.env[chosen.rank], node.env[chosen.size_variable(node) or ""])
            theirs = (node.env[other.rank], node.env[other.size_variable(node) or ""])
            if [v.strip() for v in mine] != [v.strip() for v in theirs]:
                raise EnvRanksError(
                    f"{describe_node(node)} has conflicting scheduler ranks: {chosen.rank}={mine[0]} "
                    f"{chosen.size_variable(node)}={mine[1]} but {other.rank}={theirs[0]} "
                    f"{other.size_variable(node)}={theirs[1]}; set [ranks.options] source = {chosen.name!r} "
                    f"or {other.name!r}",
                    host=node.host,
                    entry=other.rank,
                )
    return chosen


def _tasks(nodes: Sequence[RankNode], family: Family) -> list[_Task]:
    tasks: list[_Task] = []
    for node in _ordered(nodes):
        size_var = family.size_variable(node) or family.size[0]
        local = _int(node, family.local_rank) if family.local_rank in node.env else None
        tasks.append(_Task(node, _int(node, family.rank), _int(node, size_var), local, family.rank, size_var))
    sizes: dict[int, list[_Task]] = {}
    for task in tasks:
        sizes.setdefault(task.size, []).append(task)
    if len(sizes) > 1:
        parts = "; ".join(
            f"{size} on {', '.join(describe_node(t.node) for t in group)}" for size, group in sorted(sizes.items())
        )
        first = tasks[0]
        raise EnvRanksError(
            f"the nodes disagree on {first.size_var}: {parts}; they must come from one scheduler job",
            host=next(t.node.host for t in tasks if t.size != first.size),
            entry=first.size_var,
        )
    local_owner: dict[tuple[str, int], _Task] = {}
    for task in tasks:
        if task.local_rank is None:
            continue
        key = (task.node.host, task.local_rank)
        if key in local_owner:
            other = local_owner[key]
            raise EnvRanksError(
                f"nodes {other.node.node_id!r} and {task.node.node_id!r} on host {task.node.host!r} both have "
                f"{family.local_rank}={task.local_rank}; two scheduler tasks cannot share a local rank",
                host=task.node.host,
                entry=family.local_rank,
            )
        local_owner[key] = task
    return tasks


def _node_level(tasks: list[_Task]) -> list[RankNode]:
    count = len(tasks)
    owner: dict[int, _Task] = {}
    for task in tasks:
        if task.rank in owner:
            other = owner[task.rank]
            raise EnvRanksError(
                f"{describe_node(other.node)} and {describe_node(task.node)} both have {task.rank_var}={task.rank}",
                host=task.node.host,
                entry=task.rank_var,
            )
        if task.rank >= count:
            raise EnvRanksError(
                f"{describe_node(task.node)}: {task.rank_var}={task.rank} is outside 0..{count - 1} "
                f"({task.size_var}={task.size}, one task per node)",
                host=task.node.host,
                entry=task.rank_var,
            )
        owner[task.rank] = task
    return [owner[rank].node for rank in range(count)]


def _worker_level(tasks: list[_Task], world_size: int) -> list[RankNode]:
    cursor = 0
    previous: _Task | None = None
    for task in sorted(tasks, key=lambda t: (t.rank, natural_key(t.node.host), t.node.node_id)):
        end = task.rank + task.node.local_world_size
        block = f"{describe_node(task.node)}'s ranks {task.rank}..{end - 1} ({task.rank_var}={task.rank})"
        if task.rank < cursor and previous is not None:
            raise EnvRanksError(
                f"{block} overlap {describe_node(previous.node)}'s ranks {previous.rank}..{cursor - 1}",
                host=task.node.host,
                entry=task.rank_var,
            )
        if task.rank > cursor:
            after = f" after {describe_node(previous.node)}'s ranks {previous.rank}..{cursor - 1}" if previous else ""
            span = f"rank {cursor} belongs" if task.rank - 1 == cursor else f"ranks {cursor}..{task.rank - 1} belong"
            raise EnvRanksError(
                f"{span} to no node: {block} start{after}; with one scheduler "
                f"task per worker, the agent must run in each node's first task",
                host=task.node.host,
                entry=task.rank_var,
            )
        if end > world_size:
            raise EnvRanksError(
                f"{block} go past the world size {world_size} ({task.size_var}={task.size})",
                host=task.node.host,
                entry=task.rank_var,
            )
        cursor = end
        previous = task
    return [t.node for t in sorted(tasks, key=lambda t: t.rank)]


class EnvStrategy:
    """``[ranks] strategy = "env"``: global ranks from the scheduler's variables on each node.

    The variables are read from every node's :attr:`RankNode.env
    <rallypoint.agent.ranks.RankNode.env>` and checked across nodes, in this order: a family
    (see :class:`EnvOptions`) present on every node (with ``source = "auto"``, families
    present everywhere must agree); integer values; one size everywhere; the level (the size is
    the number of nodes, or the world size); scheduler local ranks distinct among the nodes of a
    host; then, at node level, node ranks exactly ``0..G-1``, or at worker level, each node's
    block ``rank..rank+L-1`` tiling ``0..N-1`` without gap or overlap. Nodes then get
    consecutive blocks of global ranks in scheduler-rank order (at worker level, exactly the
    scheduler's ranks). ``GROUP_RANK`` is the node's position in the scheduler's order (at node
    level its node rank, as torchrun's static rendezvous makes it ``--node-rank``). Role ranks
    follow global-rank order within each role.
    """

    name = NAME

    def assign(self, nodes: Sequence[RankNode], options: EnvOptions | None = None) -> RankAssignment:
        """Assign the ranks the scheduler gave."""
        options = options or EnvOptions()
        family = _family(nodes, options.source)
        tasks = _tasks(nodes, family)
        size = tasks[0].size
        count = len(nodes)
        world_size = sum(n.local_world_size for n in nodes)
        level = options.level
        if level == "auto":
            if size == count:
                level = "node"
            elif size == world_size:
                level = "worker"
            else:
                raise EnvRanksError(
                    f"{tasks[0].size_var}={size} on every node, but {count} node(s) joined running {world_size} "
                    f"worker(s): it must be the number of nodes (one scheduler task per node) or the number of "
                    f"workers (one task per worker); did every node join, with the same nproc_per_node?",
                    entry=tasks[0].size_var,
                )
        expected = count if level == "node" else world_size
        if size != expected:
            what = f"{count} node(s) joined" if level == "node" else f"the world size is {world_size}"
            raise EnvRanksError(
                f"{tasks[0].size_var}={size} on every node, but {what} (level = {level!r})",
                entry=tasks[0].size_var,
            )
        # The scheduler orders the nodes, so their position in its order is GROUP_RANK too
        # (torchrun's static rendezvous: GROUP_RANK is --node-rank, whatever the arrival order).
        # Both levels do it, so that with one worker per node (where they coincide) they agree.
        order = _node_level(tasks) if level == "node" else _worker_level(tasks, world_size)
        node_rank = {node.node_id: i for i, node in enumerate(order)}
        blocks = assign_blocks(order)
        return RankAssignment(tuple(dataclasses.replace(w, group_rank=node_rank[w.node_id]) for w in blocks.workers))
