"""Rank assignment: which global, local and role ranks every worker of the job gets.

After a rendezvous round every agent knows the same participants (one :class:`RankNode` per
node). A *rank strategy* turns them into the ranks of every worker in the job (a
:class:`RankAssignment`). Strategies are pure and deterministic: each agent computes the whole
assignment locally from the same inputs, so no extra round trip is needed, and every agent
agrees.

Strategies are registered with the ``rallypoint_rank_strategies`` hook
(:class:`~rallypoint.agent.records.RankStrategyRecord`) and selected with
``[ranks] strategy = "<name>"``; their ``[ranks.options]`` are validated once, by the job's
config resolution, and handed to them as given. The built-in ``default`` strategy
(:class:`DefaultStrategy`) assigns ranks as torchrun does. A strategy that decides an order of
the nodes builds its result with :func:`assign_blocks` (contiguous blocks of ranks in that
order); one that places single workers, with :func:`assign_ranks`. :func:`compute_assignment`
loads a strategy, runs it and checks the result with :func:`validate_assignment`; a broken
result is a :class:`RankAssignmentError` that names the strategy, the node or rank and what is
wrong.

The package, by job:

* :mod:`~rallypoint.agent.ranks.model`: the rank records (:class:`RankNode`,
  :class:`WorkerRanks`, :class:`RankAssignment`) and :class:`RankAssignmentError`;
* :mod:`~rallypoint.agent.ranks.blocks`: :func:`assign_blocks` and :func:`assign_ranks`;
* :mod:`~rallypoint.agent.ranks.strategy`: the :class:`RankStrategy` protocol and
  :class:`DefaultStrategy`;
* :mod:`~rallypoint.agent.ranks.validation`: :func:`check_nodes` and
  :func:`validate_assignment`;
* :mod:`~rallypoint.agent.ranks.loading`: :func:`load_strategy` and :func:`compute_assignment`.

Node labels are part of a node's identity: they live in :mod:`rallypoint.agent.node` and are
re-exported here.

Examples:
    >>> nodes = [RankNode(node_id="a", group_rank=0, host="a", local_world_size=2),
    ...          RankNode(node_id="b", group_rank=1, host="b", local_world_size=2)]
    >>> assignment = compute_assignment(DefaultStrategy(), nodes)
    >>> [(w.node_id, w.local_rank, w.rank) for w in assignment]
    [('a', 0, 0), ('a', 1, 1), ('b', 0, 2), ('b', 1, 3)]
"""

from __future__ import annotations

import warnings
from typing import Any

from rallypoint.agent.node import NODE_LABELS_ENV, NodeLabelsError, parse_node_labels, read_node_labels
from rallypoint.agent.ranks.blocks import assign_blocks, assign_ranks
from rallypoint.agent.ranks.loading import compute_assignment, load_strategy
from rallypoint.agent.ranks.model import DEFAULT_ROLE, RankAssignment, RankAssignmentError, RankNode, WorkerRanks
from rallypoint.agent.ranks.strategy import DefaultStrategy, RankStrategy
from rallypoint.agent.ranks.validation import check_nodes, validate_assignment

__all__ = [
    # data model
    "RankNode",
    "WorkerRanks",
    "RankAssignment",
    # node labels (rallypoint.agent.node)
    "NODE_LABELS_ENV",
    "NodeLabelsError",
    "parse_node_labels",
    "read_node_labels",
    # strategies
    "RankStrategy",
    "DefaultStrategy",
    "DEFAULT_ROLE",
    "assign_blocks",
    "assign_ranks",
    # checking and running
    "RankAssignmentError",
    "check_nodes",
    "validate_assignment",
    "load_strategy",
    "compute_assignment",
]


def __getattr__(name: str) -> Any:
    # ``NodeInfo`` was this type's name; ``rallypoint.rendezvous.state.NodeInfo`` is the rendezvous record.
    if name == "NodeInfo":
        warnings.warn(
            "rallypoint.agent.ranks.NodeInfo is now RankNode; import RankNode instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return RankNode
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
