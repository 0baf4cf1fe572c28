"""Warm workers: fork each worker from a process that has already imported the heavy modules.

``[agent] preload = ["torch"]`` (or ``--preload torch``) makes the agent start one warm process
per node that imports the listed modules once; every worker of every attempt is then forked from
it and runs its script as ``__main__``, without importing those modules again. See
:mod:`rallypoint.agent.warm.client` (the agent's side: the launcher, its
:mod:`~rallypoint.agent.warm.connection` to the warm process and each worker's
:mod:`~rallypoint.agent.warm.forked_worker` handle) and :mod:`rallypoint.agent.warm._server` (the
warm process).
"""

from rallypoint.agent.warm.client import (
    WarmLauncher,
    WarmProcess,
    WarmRefusedError,
    preload_problem,
    warm_environment,
)

__all__ = ["WarmLauncher", "WarmProcess", "WarmRefusedError", "preload_problem", "warm_environment"]
