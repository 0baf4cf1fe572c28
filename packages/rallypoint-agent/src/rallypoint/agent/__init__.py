"""The rallypoint elastic agent: rendezvous, rank assignment, worker processes, restarts, reports.

Hook specifications live in :mod:`rallypoint.agent.hookspecs`.
"""

from rallypoint.agent.records import RankStrategyRecord

__all__ = ["RankStrategyRecord"]
