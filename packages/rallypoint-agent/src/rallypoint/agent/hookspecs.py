"""Hook specifications of ``rallypoint-agent``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rallypoint.agent.records import RankStrategyRecord
from rallypoint.core.plugins import hookspec

if TYPE_CHECKING:  # the agent's modules load only when an agent runs, not with the hook specs
    from rallypoint.agent.env import WorkerContext
    from rallypoint.agent.report import WorkerFailure
    from rallypoint.agent.workers import WorkerGroup


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
def rallypoint_agent_workers_started(group: WorkerGroup) -> None:
    """Called after the agent started its local workers for a round.

    Args:
        group: the local worker group: ``group.pids`` maps each worker's global rank to its pid.
    """


@hookspec
def rallypoint_agent_worker_failed(failure: WorkerFailure) -> None:
    """Called when a local worker exits with a failure, before any restart decision.

    Args:
        failure: rank, host, attempt, exit code or signal, the reason, and the worker's error
            file (exception and traceback) and stderr tail.
    """


@hookspec(firstresult=True)
def rallypoint_agent_should_restart(failure: WorkerFailure) -> bool | None:
    """Decide whether the job restarts after ``failure``.

    Stops at the first non-``None`` result. Returning ``None`` leaves the decision to the
    restart budget (``[agent] max_restarts``).

    Args:
        failure: the failure that ended the current attempt.
    """


@hookspec
def rallypoint_worker_env(worker: WorkerContext) -> dict[str, str] | None:
    """Extra environment variables for one worker.

    Every implementation's result is merged (later plugins win on equal keys); the torchrun
    variables the agent sets cannot be overridden.

    Args:
        worker: the worker about to start: its ranks (``worker.ranks``: global, local and role
            ranks), run id, round, attempt, store address and error file.
    """
