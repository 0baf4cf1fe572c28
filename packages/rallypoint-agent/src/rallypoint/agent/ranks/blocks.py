"""Building assignments: the helpers a strategy uses once it has decided where ranks go.

Most strategies only decide an *order* of the nodes; :func:`assign_blocks` turns that order
into a complete :class:`~rallypoint.agent.ranks.RankAssignment` (every node's workers take the
next block of global ranks, and of role ranks within their role). A strategy that places
single workers (a node's ranks need not be contiguous) decides each worker's global rank and
calls :func:`assign_ranks`. Both fill in every other field of :class:`WorkerRanks` (world
sizes, role ranks, group ranks) the same way, so strategies differ only in what they decide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rallypoint.agent.ranks.model import RankAssignment, RankNode, WorkerRanks

__all__ = ["assign_blocks", "assign_ranks"]


def _role_sizes(nodes: Iterable[RankNode]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for node in nodes:
        sizes[node.role] = sizes.get(node.role, 0) + node.local_world_size
    return sizes


def _unique(nodes: Sequence[RankNode]) -> dict[str, RankNode]:
    by_id: dict[str, RankNode] = {}
    for node in nodes:
        if node.node_id in by_id:
            raise ValueError(f"node id {node.node_id!r} appears more than once")
        by_id[node.node_id] = node
    return by_id


def assign_ranks(nodes: Sequence[RankNode], ranks: Mapping[str, Sequence[int]]) -> RankAssignment:
    """The assignment in which ``ranks[node_id][local_rank]`` is that worker's global rank.

    Every other field follows: ``world_size`` is the sum of the nodes' local world sizes;
    ``group_rank``, ``local_world_size`` and ``role`` are the node's; ``group_world_size`` is
    the number of nodes; role ranks follow global-rank order within each role (``0..R-1`` per
    role).

    Args:
        nodes: every participant of the round.
        ranks: for every node id, the global ranks of its workers in local-rank order, one per
            local worker. Together they should be ``0..N-1``; the agent checks the result with
            :func:`~rallypoint.agent.ranks.validate_assignment`, so a mistake is reported, not
            run.

    Raises:
        ValueError: a node id repeats, or ``ranks`` names a node that is not in ``nodes``.

    Examples:
        >>> a = RankNode(node_id="a", group_rank=0, host="a", local_world_size=2)
        >>> b = RankNode(node_id="b", group_rank=1, host="b", local_world_size=2)
        >>> [(w.node_id, w.local_rank, w.rank) for w in assign_ranks([a, b], {"a": [0, 2], "b": [1, 3]})]
        [('a', 0, 0), ('b', 0, 1), ('a', 1, 2), ('b', 1, 3)]
    """
    by_id = _unique(nodes)
    unknown = sorted(set(ranks) - set(by_id))
    if unknown:
        raise ValueError(f"ranks are given for unknown node(s) {', '.join(map(repr, unknown))}")
    world_size = sum(n.local_world_size for n in nodes)
    role_sizes = _role_sizes(nodes)
    role_next = dict.fromkeys(role_sizes, 0)
    slots = sorted((rank, node_id, local) for node_id, given in ranks.items() for local, rank in enumerate(given))
    workers: list[WorkerRanks] = []
    for rank, node_id, local_rank in slots:
        node = by_id[node_id]
        workers.append(
            WorkerRanks(
                node_id=node_id,
                local_rank=local_rank,
                rank=rank,
                world_size=world_size,
                role=node.role,
                role_rank=role_next[node.role],
                role_world_size=role_sizes[node.role],
                local_world_size=node.local_world_size,
                group_rank=node.group_rank,
                group_world_size=len(nodes),
            )
        )
        role_next[node.role] += 1
    return RankAssignment(tuple(workers))


def assign_blocks(order: Iterable[RankNode]) -> RankAssignment:
    """Contiguous blocks: the nodes, in the order given, take consecutive blocks of ranks.

    The first node's workers get global ranks ``0..L0-1`` in local-rank order, the next node's
    the following ``L1`` ranks, and so on. Role ranks are assigned the same way among the nodes
    of each role, in the same order. This is the rule of the ``default`` strategy (nodes in
    group-rank order) and of every bundled strategy that orders nodes; a strategy of your own
    that orders nodes needs nothing else.

    Args:
        order: every participant of the round, each once, in the order that gets ranks. Sort on
            the nodes' content (host, labels, node id...), never on the order of the list the
            strategy received: every agent must reach the same order.

    Raises:
        ValueError: a node appears twice.

    Examples:
        >>> a = RankNode(node_id="a", group_rank=0, host="a", local_world_size=2)
        >>> b = RankNode(node_id="b", group_rank=1, host="b", local_world_size=1)
        >>> [(w.node_id, w.local_rank, w.rank) for w in assign_blocks([b, a])]
        [('b', 0, 0), ('a', 0, 1), ('a', 1, 2)]
    """
    nodes = list(order)
    _unique(nodes)
    ranks: dict[str, list[int]] = {}
    base = 0
    for node in nodes:
        ranks[node.node_id] = list(range(base, base + node.local_world_size))
        base += node.local_world_size
    return assign_ranks(nodes, ranks)
