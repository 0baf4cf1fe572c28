"""A failed worker's record, and which exits of an ended attempt count as failures.

The record (:class:`~rallypoint.agent.report.WorkerFailure`) gathers what the failure report
shows of one worker: how it ended (or, when a watchdog or the hang watch killed it, why and
when), the exception and traceback from its error file, the tail of its stderr and its log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rallypoint.agent.error_files import read_error_file
from rallypoint.agent.report import WorkerFailure

if TYPE_CHECKING:
    from rallypoint.agent.logs import WorkerLogs
    from rallypoint.agent.ranks import WorkerRanks
    from rallypoint.agent.workers import WorkerExit

__all__ = ["failure_record", "failures_of_attempt"]

#: why and when a worker was killed on purpose (a watchdog, the hang watch); ``None``: it was not
Explain = Callable[["WorkerExit"], "tuple[str, float] | None"]


def failure_record(
    ex: WorkerExit,
    ranks: WorkerRanks,
    logs: WorkerLogs,
    attempt_dir: Path,
    *,
    attempt: int,
    node_id: str,
    host: str,
    explain: Explain,
) -> WorkerFailure:
    """The failure record of worker ``ex.rank`` of attempt ``attempt`` (its files under ``attempt_dir``)."""
    err = read_error_file(attempt_dir / f"rank_{ex.rank}.error.json")
    log_file = logs.log_path(ex.rank)
    reason, failed_at = ex.describe(), ex.exited_at
    killed = explain(ex)
    if killed is not None:  # its watchdog timer expired: it failed then, and the reason says so
        reason, failed_at = killed
    return WorkerFailure(
        rank=ex.rank,
        local_rank=ranks.local_rank,
        host=host,
        node_id=node_id,
        attempt=attempt,
        pid=ex.pid,
        exit_code=ex.exit_code,
        signal=ex.signal_name,
        time=failed_at,
        reason=reason,
        exception=err.message if err is not None and err.problem is None else None,
        traceback=err.traceback if err is not None else None,
        stderr_tail=tuple(logs.stderr_tail(ex.rank)),
        log_file=str(log_file) if log_file else None,
    )


def failures_of_attempt(
    exits: Mapping[int, WorkerExit],
    first: WorkerExit | None,
    stopped_at: float,
    record: Callable[[WorkerExit], WorkerFailure],
) -> list[WorkerFailure]:
    """The failures of a failed attempt, oldest first.

    ``first``: the exit that failed the attempt; ``stopped_at``: when the agent stopped the
    others. Clean exits, and workers that ended after the stop (stopped by the agent, not by a
    failure of their own), are not failures.
    """
    failures = []
    for ex in sorted(exits.values(), key=lambda e: e.exited_at):
        if ex.ok or (ex is not first and ex.exited_at >= stopped_at):
            continue
        failures.append(record(ex))
    return failures
