"""Hook specifications of ``rallypoint-agent``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rallypoint.agent.records import RankStrategyRecord
from rallypoint.core.plugins import hookspec


@hookspec
def rallypoint_rank_strategies() -> Iterable[RankStrategyRecord]:
    """Register rank-assignment strategies.

    Returns:
        :class:`~rallypoint.agent.records.RankStrategyRecord` records, selected by
        ``[ranks] strategy``.

    Example::

        @hookimpl
        def rallypoint_rank_strategies():
            return [RankStrategyRecord(name="by-gpu-count", factory="my_ranks:by_gpu_count")]
    """
    return ()


@hookspec
def rallypoint_agent_workers_started(group: Any) -> None:
    """Called after the agent started its local workers for a round.

    Args:
        group: the local worker group (round, ranks, pids).
    """


@hookspec
def rallypoint_agent_worker_failed(failure: Any) -> None:
    """Called when a local worker exits with a failure, before any restart decision.

    Args:
        failure: rank, host, exit code or signal, and error file contents.
    """


@hookspec(firstresult=True)
def rallypoint_agent_should_restart(failure: Any) -> bool | None:
    """Decide whether the job restarts after ``failure``.

    Stops at the first non-``None`` result. Returning ``None`` leaves the decision to the
    restart budget (``[agent] max_restarts``).

    Args:
        failure: the failure that ended the current attempt.
    """


@hookspec
def rallypoint_worker_env(worker: Any) -> dict[str, str] | None:
    """Extra environment variables for one worker.

    Every implementation's result is merged (later plugins win on equal keys); the torchrun
    variables the agent sets cannot be overridden.

    Args:
        worker: the worker about to start (its ranks, role and attempt).
    """
