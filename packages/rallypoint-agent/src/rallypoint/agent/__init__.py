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
    # the records lifecycle and decision hooks receive (see rallypoint.agent.hookspecs)
    "WorkerContext",
    "WorkerFailure",
    "WorkerGroup",
]

#: Hook-argument types, imported on first use: ``import rallypoint.agent`` stays light.
_HOOK_RECORDS = {
    "WorkerContext": "rallypoint.agent.env",
    "WorkerFailure": "rallypoint.agent.report",
    "WorkerGroup": "rallypoint.agent.workers",
}


def __getattr__(name: str) -> object:
    module = _HOOK_RECORDS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
