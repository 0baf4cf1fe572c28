"""Checking a strategy's inputs (:func:`check_nodes`) and its result (:func:`validate_assignment`).

:func:`validate_assignment` runs a fixed list of checks, each a function from the assignment
and the nodes to the first problem it finds (or ``None``); the first problem found is raised
as a :class:`~rallypoint.agent.ranks.RankAssignmentError` naming the strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rallypoint.agent.ranks.model import RankAssignment, RankAssignmentError, RankNode, WorkerRanks, is_int

__all__ = ["check_nodes", "validate_assignment"]

#: The fields of :class:`WorkerRanks` that must be ints.
_INT_FIELDS = (
    "local_rank",
    "rank",
    "world_size",
    "role_rank",
    "role_world_size",
    "local_world_size",
    "group_rank",
    "group_world_size",
)


def check_nodes(nodes: Sequence[RankNode]) -> None:
    """Check the strategy inputs: unique node ids and group ranks exactly ``0..G-1``.

    These come from the rendezvous, so a failure here is a bug there, not in a strategy.

    Raises:
        ValueError: no nodes, a repeated node id, or group ranks that are not ``0..G-1``.

    Examples:
        >>> check_nodes([RankNode(node_id="a", group_rank=1, host="a", local_world_size=1)])
        Traceback (most recent call last):
        ...
        ValueError: group ranks of the nodes must be 0..0 (one per node), got [1]
    """
    if not nodes:
        raise ValueError("rank assignment needs at least one node")
    seen: set[str] = set()
    for node in nodes:
        if not isinstance(node, RankNode):
            raise ValueError(f"expected RankNode, got {node!r}")
        if node.node_id in seen:
            raise ValueError(f"node id {node.node_id!r} appears more than once")
        seen.add(node.node_id)
    group_ranks = sorted(n.group_rank for n in nodes)
    if group_ranks != list(range(len(nodes))):
        raise ValueError(f"group ranks of the nodes must be 0..{len(nodes) - 1} (one per node), got {group_ranks}")


def _describe(worker: WorkerRanks) -> str:
    return f"node {worker.node_id!r} local rank {worker.local_rank!r}"


def _range_text(size: int) -> str:
    return f"0..{size - 1}" if size > 0 else "empty"


def _role_sizes(nodes: Sequence[RankNode]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for node in nodes:
        sizes[node.role] = sizes.get(node.role, 0) + node.local_world_size
    return sizes


def _check_workers(assignment: RankAssignment, nodes: Sequence[RankNode]) -> str | None:
    """Every worker is a :class:`WorkerRanks` on a known node, with int fields."""
    known = {n.node_id for n in nodes}
    for worker in assignment.workers:
        if not isinstance(worker, WorkerRanks):
            return f"expected WorkerRanks, got {worker!r}"
        if worker.node_id not in known:
            return (
                f"{_describe(worker)} (global rank {worker.rank!r}): unknown node {worker.node_id!r}; "
                f"known nodes: {', '.join(repr(k) for k in sorted(known))}"
            )
        for name in _INT_FIELDS:
            value = getattr(worker, name)
            if not is_int(value):
                return f"{_describe(worker)}: {name} is {value!r}, not an int"
    return None


def _check_node_workers(assignment: RankAssignment, nodes: Sequence[RankNode]) -> str | None:
    """Each node has local ranks ``0..L-1``, and its workers carry the node's fields."""
    for node in sorted(nodes, key=lambda n: n.group_rank):
        workers = assignment.by_node.get(node.node_id, ())
        local_ranks = [w.local_rank for w in workers]
        if local_ranks != list(range(node.local_world_size)):
            where = f"node {node.node_id!r} (group rank {node.group_rank}, host {node.host!r})"
            return (
                f"{where}: local ranks are {local_ranks}, expected {_range_text(node.local_world_size)} "
                f"(local_world_size {node.local_world_size})"
            )
        expected: dict[str, object] = {
            "local_world_size": node.local_world_size,
            "group_world_size": len(nodes),
            "role": node.role,
        }
        for worker in workers:
            for name, want in expected.items():
                got = getattr(worker, name)
                if got != want:
                    return f"{_describe(worker)}: {name} is {got!r}, expected {want!r}"
            if worker.group_rank != workers[0].group_rank:
                return (
                    f"{_describe(worker)}: group_rank is {worker.group_rank!r}, expected {workers[0].group_rank!r} "
                    "(as local rank 0: a node's workers share one group rank)"
                )
    return None


def _check_group_ranks(assignment: RankAssignment, nodes: Sequence[RankNode]) -> str | None:
    """The nodes' group ranks (``GROUP_RANK``) are ``0..G-1``, each given to one node."""
    owner: dict[int, str] = {}
    for node in nodes:
        workers = assignment.by_node.get(node.node_id, ())
        if not workers:
            continue  # a node without workers has local_world_size 0, refused by check_nodes
        group_rank = workers[0].group_rank
        if not 0 <= group_rank < len(nodes):
            return f"{_describe(workers[0])}: group rank {group_rank} is outside {_range_text(len(nodes))}"
        if group_rank in owner:
            return f"group rank {group_rank} is given to both node {owner[group_rank]!r} and node {node.node_id!r}"
        owner[group_rank] = node.node_id
    return None


def _check_global_ranks(assignment: RankAssignment, nodes: Sequence[RankNode]) -> str | None:
    """Every worker has the world size ``N``; the global ranks are ``0..N-1``, each once."""
    world_size = sum(n.local_world_size for n in nodes)
    owner: dict[int, WorkerRanks] = {}
    for worker in assignment.workers:
        if worker.world_size != world_size:
            return (
                f"{_describe(worker)}: world_size is {worker.world_size}, expected {world_size} "
                f"(sum of local_world_size over {len(nodes)} node(s))"
            )
        if not 0 <= worker.rank < world_size:
            return f"{_describe(worker)}: global rank {worker.rank} is outside {_range_text(world_size)}"
        if worker.rank in owner:
            return f"global rank {worker.rank} is given to both {_describe(owner[worker.rank])} and {_describe(worker)}"
        owner[worker.rank] = worker
    return None


def _check_role_ranks(assignment: RankAssignment, nodes: Sequence[RankNode]) -> str | None:
    """Per role, every worker has the role's size ``R``; the role ranks are ``0..R-1``, each once."""
    role_sizes = _role_sizes(nodes)
    owner: dict[tuple[str, int], WorkerRanks] = {}
    for worker in assignment.workers:
        size = role_sizes[worker.role]
        if worker.role_world_size != size:
            return (
                f"{_describe(worker)}: role_world_size is {worker.role_world_size}, expected {size} "
                f"(workers with role {worker.role!r})"
            )
        if not 0 <= worker.role_rank < size:
            return (
                f"{_describe(worker)}: role rank {worker.role_rank} is outside {_range_text(size)} "
                f"for role {worker.role!r}"
            )
        key = (worker.role, worker.role_rank)
        if key in owner:
            return (
                f"role {worker.role!r} rank {worker.role_rank} is given to both "
                f"{_describe(owner[key])} and {_describe(worker)}"
            )
        owner[key] = worker
    return None


#: The checks of :func:`validate_assignment`, in order; each relies on the ones before it.
_CHECKS: tuple[Callable[[RankAssignment, Sequence[RankNode]], str | None], ...] = (
    _check_workers,
    _check_node_workers,
    _check_group_ranks,
    _check_global_ranks,
    _check_role_ranks,
)


def validate_assignment(assignment: RankAssignment, nodes: Sequence[RankNode], strategy_name: str) -> None:
    """Check that ``assignment`` is a complete, consistent assignment for ``nodes``.

    Checked, in this order (the first violation is reported):

    * every worker is on a known node and its integer fields are ints;
    * each node has exactly the local ranks ``0..L-1``, ``L`` its ``local_world_size``, and
      its workers carry the node's ``local_world_size``, ``role``, the number of nodes as
      ``group_world_size`` and one ``group_rank``;
    * the nodes' group ranks are ``0..G-1``, each given to one node (strategies keep the
      rendezvous's group rank, except where a scheduler numbers the nodes: the ``env`` strategy
      gives each node its position in the scheduler's order, as torchrun's static rendezvous
      does with ``--node-rank``);
    * every worker's ``world_size`` is the total ``N`` and the global ranks are ``0..N-1``,
      each used once;
    * per role, ``role_world_size`` is the role's worker count ``R`` and the role ranks are
      ``0..R-1``, each used once.

    Nodes' workers need not have contiguous global ranks.

    Args:
        assignment: what the strategy returned.
        nodes: the strategy's inputs.
        strategy_name: the strategy's name, for the error message.

    Raises:
        RankAssignmentError: the first violation found, naming the node or rank.
        ValueError: ``nodes`` themselves are inconsistent (see :func:`check_nodes`).

    Examples:
        >>> nodes = [RankNode(node_id="a", group_rank=0, host="a", local_world_size=2)]
        >>> w = WorkerRanks(node_id="a", local_rank=0, rank=0, world_size=2, role="default",
        ...                 role_rank=0, role_world_size=2, local_world_size=2, group_rank=0,
        ...                 group_world_size=1)
        >>> try:
        ...     validate_assignment(RankAssignment((w,)), nodes, "mine")
        ... except RankAssignmentError as error:
        ...     print(error.detail)
        node 'a' (group rank 0, host 'a'): local ranks are [0], expected 0..1 (local_world_size 2)
    """
    check_nodes(nodes)
    if not isinstance(assignment, RankAssignment):
        raise RankAssignmentError(strategy_name, f"expected a RankAssignment, got {type(assignment).__name__}")
    for check in _CHECKS:
        problem = check(assignment, nodes)
        if problem is not None:
            raise RankAssignmentError(strategy_name, problem)
