"""The rallypoint elastic agent: rendezvous, rank assignment, worker processes, restarts, reports.

Hook specifications live in :mod:`rallypoint.agent.hookspecs`; rank assignment in
:mod:`rallypoint.agent.ranks`.
"""

from rallypoint.agent.ranks import (
    DefaultStrategy,
    RankAssignment,
    RankAssignmentError,
    RankNode,
    RankStrategy,
    WorkerRanks,
    assign_blocks,
    compute_assignment,
    validate_assignment,
)
from rallypoint.agent.records import RankStrategyRecord

__all__ = [
    "DefaultStrategy",
    "RankAssignment",
    "RankAssignmentError",
    "RankNode",
    "RankStrategy",
    "RankStrategyRecord",
    "WorkerRanks",
    "assign_blocks",
    "compute_assignment",
    "validate_assignment",
]
