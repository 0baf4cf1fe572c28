"""The rallypoint elastic agent: rendezvous, rank assignment, worker processes, restarts, reports.

Hook specifications live in :mod:`rallypoint.agent.hookspecs`; rank assignment in
:mod:`rallypoint.agent.ranks`.
"""

from rallypoint.agent.ranks import (
    DefaultStrategy,
    NodeInfo,
    RankAssignment,
    RankAssignmentError,
    RankStrategy,
    WorkerRanks,
    compute_assignment,
    validate_assignment,
)
from rallypoint.agent.records import RankStrategyRecord

__all__ = [
    "DefaultStrategy",
    "NodeInfo",
    "RankAssignment",
    "RankAssignmentError",
    "RankStrategy",
    "RankStrategyRecord",
    "WorkerRanks",
    "compute_assignment",
    "validate_assignment",
]
