"""The rank-strategy protocol and the built-in ``default`` strategy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from rallypoint.agent.ranks.blocks import assign_blocks
from rallypoint.agent.ranks.model import RankAssignment, RankNode

__all__ = ["DefaultStrategy", "RankStrategy"]


@runtime_checkable
class RankStrategy(Protocol):
    """A rank-assignment strategy.

    ``assign`` must be pure and deterministic: the result depends only on the set of nodes (not
    on the order of ``nodes``) and on ``options``, because every agent computes it independently
    and all must agree. It must not do I/O or read the process environment (use
    :attr:`RankNode.env <rallypoint.agent.ranks.RankNode.env>`).

    A registered factory may also be a plain function ``(nodes, options) -> RankAssignment``;
    :func:`~rallypoint.agent.ranks.load_strategy` adapts it. A strategy that only orders the
    nodes returns :func:`~rallypoint.agent.ranks.assign_blocks` of that order.

    Example::

        class Reversed:
            def assign(self, nodes, options):
                return assign_blocks(sorted(nodes, key=lambda n: -n.group_rank))
    """

    def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
        """Assign ranks to every worker of ``nodes``.

        Args:
            nodes: every participant of the round, in any order.
            options: the validated ``[ranks.options]`` (an instance of the record's
                ``options_model``, as the job's config resolution built it), or ``None``.
        """
        ...


class DefaultStrategy:
    """The torchrun-compatible strategy (``[ranks] strategy = "default"``).

    Nodes are taken in group-rank order. A node's first global rank is the sum of the local
    world sizes of the nodes before it; its workers get consecutive ranks in local-rank order.
    Role ranks are computed the same way among the nodes of the same role (roles interleave in
    group-rank order; they are not sorted). Local world sizes may differ between nodes. For
    identical nodes with one role this is ``rank = group_rank * local_world_size + local_rank``
    and ``role_rank = rank``. Takes no options.

    Examples:
        >>> nodes = [RankNode(node_id="t0", group_rank=0, host="h0", local_world_size=2, role="trainer"),
        ...          RankNode(node_id="e0", group_rank=1, host="h1", local_world_size=1, role="eval"),
        ...          RankNode(node_id="t1", group_rank=2, host="h2", local_world_size=2, role="trainer")]
        >>> [(w.rank, w.role, w.role_rank) for w in DefaultStrategy().assign(nodes, None)]
        [(0, 'trainer', 0), (1, 'trainer', 1), (2, 'eval', 0), (3, 'trainer', 2), (4, 'trainer', 3)]
    """

    name = "default"

    def assign(self, nodes: Sequence[RankNode], options: Any = None) -> RankAssignment:
        """Assign ranks as torchrun does: contiguous blocks in group-rank order; ``options`` is ignored."""
        return assign_blocks(sorted(nodes, key=lambda n: (n.group_rank, n.node_id)))
