"""Hook specifications of ``rallypoint-agent``.

Lifecycle hooks (``rallypoint_agent_workers_started``, ``rallypoint_agent_worker_failed``) and
decision hooks (``rallypoint_agent_should_restart``, ``rallypoint_worker_env``) receive typed
records exported by :mod:`rallypoint.agent`: :class:`~rallypoint.agent.workers.WorkerGroup`,
:class:`~rallypoint.agent.report.WorkerFailure` and :class:`~rallypoint.agent.env.WorkerContext`.
Hooks are called with keyword arguments: an implementation may take fewer arguments than its
specification names, so a specification can gain an argument without breaking it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rallypoint.agent.records import LaunchEnvironmentRecord, RankStrategyRecord
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
def rallypoint_launch_environments() -> Iterable[LaunchEnvironmentRecord]:
    """Register launch environments: schedulers the agent detects and takes the job's shape from.

    Returns:
        :class:`~rallypoint.agent.records.LaunchEnvironmentRecord` records, selected by
        ``[launch] environment`` (``"auto"``: the first whose detector recognizes the environment).

    Example::

        @hookimpl
        def rallypoint_launch_environments():
            return [LaunchEnvironmentRecord(name="pbs", factory="my_pbs:detect", order=50)]
    """
    return ()


@hookspec
def rallypoint_agent_workers_started(group: WorkerGroup) -> None:
    """Called after the agent started its local workers for a round.

    Args:
        group: the local worker group (:class:`~rallypoint.agent.workers.WorkerGroup`):
            ``group.pids`` maps each worker's global rank to its pid.

    Example::

        @hookimpl
        def rallypoint_agent_workers_started(group):
            for rank, pid in sorted(group.pids.items()):
                print(f"worker {rank} is pid {pid}")
    """


@hookspec
def rallypoint_agent_worker_failed(failure: WorkerFailure) -> None:
    """Called when a local worker exits with a failure, before any restart decision.

    Args:
        failure: the :class:`~rallypoint.agent.report.WorkerFailure`: rank, host, attempt, exit
            code or signal, the reason, and the worker's error file (exception and traceback)
            and stderr tail.

    Example::

        @hookimpl
        def rallypoint_agent_worker_failed(failure):
            alert(f"rank {failure.rank} on {failure.host}: {failure.reason}", failure.stderr_tail)
    """


@hookspec(firstresult=True)
def rallypoint_agent_should_restart(failure: WorkerFailure) -> bool | None:
    """Decide whether the job restarts after ``failure``.

    Stops at the first non-``None`` result. Returning ``None`` leaves the decision to the
    restart budget (``[agent] max_restarts``).

    Args:
        failure: the :class:`~rallypoint.agent.report.WorkerFailure` that ended the current
            attempt.

    Example::

        @hookimpl
        def rallypoint_agent_should_restart(failure):
            if failure.exit_code == 3:  # the script's way of saying "a retry cannot help"
                return False
            return None  # the restart budget decides
    """


@hookspec
def rallypoint_worker_env(worker: WorkerContext) -> dict[str, str] | None:
    """Extra environment variables for one worker.

    Every implementation's result is merged (later plugins win on equal keys); the torchrun
    variables the agent sets cannot be overridden.

    Args:
        worker: the :class:`~rallypoint.agent.env.WorkerContext` of the worker about to start:
            its ranks (``worker.ranks``: global, local and role ranks), run id, round, attempt,
            store address and error file.

    Example::

        @hookimpl
        def rallypoint_worker_env(worker):
            return {"WANDB_RUN_GROUP": worker.run_id, "SHARD": str(worker.ranks.rank)}
    """
