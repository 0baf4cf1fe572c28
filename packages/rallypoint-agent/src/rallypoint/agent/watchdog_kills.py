"""The agent's side of watchdog timers: serve them, and kill (and account for) a worker whose timer expired.

When a timer expires, the order matters:

1. the hang report is gathered from every node while the hang is still there
   (:meth:`rallypoint.agent.debug_service.DebugService.report_hang`);
2. the expired worker's failure is published, dated at its timer's deadline, *before* the kill:
   once it is killed its peers fail too (their collectives lose it), and the node that closes the
   job may print its report before this node saw its own worker's exit;
3. the worker's process group gets SIGKILL; the agent's monitor then sees the exit, and its
   failure record (the same key, the same time) replaces the early one with how it ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rallypoint.agent.watchdog import WatchdogExpiry, WatchdogServer, expired_reason
from rallypoint.agent.workers import WorkerExit

if TYPE_CHECKING:
    from pydantic import BaseModel

    from rallypoint.agent.debug_service import DebugService
    from rallypoint.agent.report import WorkerFailure
    from rallypoint.agent.workers import WorkerGroup
    from rallypoint.core.records import BackendRecord

__all__ = ["WatchdogKills"]

#: Builds the failure record of one worker exit of the current attempt.
FailureOf = Callable[[WorkerExit], "WorkerFailure"]


class WatchdogKills:
    """Serves the job's watchdog timers on this node and kills the workers whose timers expire.

    Args:
        record: the watchdog backend's record (``[timer] watchdog``).
        options: its validated options.
        debug: this node's debug service (gathers the hang report before a kill).
        say: prints one agent line.
        publish: publishes one worker failure for every node's report (not printed).
    """

    def __init__(
        self,
        record: BackendRecord,
        options: BaseModel | None,
        debug: DebugService,
        say: Callable[[str], None],
        publish: Callable[[WorkerFailure], None],
    ) -> None:
        self.record, self.options = record, options
        self._debug, self._say, self._publish = debug, say, publish
        self._server: WatchdogServer | None = None
        self._expired: dict[int, WatchdogExpiry] = {}
        self._group: WorkerGroup | None = None
        self._failure_of: FailureOf | None = None
        self._lock = threading.Lock()

    def start(self, log_dir: Path) -> None:
        """Start the backend's server (its files, if any, under ``log_dir``)."""
        self._server = self.record.load().start_server(log_dir, self.options)
        self._server.set_expiry_handler(self.on_expiry)
        self._say(f"watchdog timers: {self.record.name}")

    def stop(self) -> None:
        """Stop the server."""
        if self._server is not None:
            self._server.stop()

    def worker_env(self, rank: int) -> Mapping[str, str]:
        """The variables that connect worker ``rank`` to the server."""
        return self._server.worker_env(rank) if self._server is not None else {}

    def follow(self, group: WorkerGroup | None, failure_of: FailureOf | None = None) -> None:
        """Watch ``group``'s workers (``None``: the attempt is over); ``failure_of`` builds their failure records."""
        with self._lock:
            self._group, self._failure_of = group, failure_of
        if group is not None and self._server is not None:
            for rank, pid in group.pids.items():
                self._server.register_worker(pid, rank)

    def explain(self, ex: WorkerExit) -> tuple[str, float] | None:
        """How a killed worker's failure reads (with the hang's diagnosis), and when it failed.

        ``None``: no timer of that worker expired.
        """
        expiry = self._expired.get(ex.pid)
        if expiry is None:
            return None
        # it failed when its timer expired: the kill came later, after the hang report
        return expired_reason(expiry, ex.describe(), self._debug.diagnosis), min(ex.exited_at, expiry.deadline)

    def on_expiry(self, expiry: WatchdogExpiry) -> None:
        """Gather the hang report, publish the worker's failure, then kill its process group."""
        with self._lock:
            group, failure_of = self._group, self._failure_of
        rank = next((r for r, pid in group.pids.items() if pid == expiry.pid), None) if group is not None else None
        if rank is None:
            return  # not a worker of the current attempt (a stale expiry)
        self._expired[expiry.pid] = expiry
        self._say(expiry.describe() + "; gathering every worker's stacks (debug stacks), then killing it")
        self._debug.report_hang(expiry.describe(), self._say)  # before the kill: the hang is still there
        if failure_of is not None:
            doomed = WorkerExit(rank, expiry.pid, -int(signal.SIGKILL), float("nan"), expiry.deadline)
            with contextlib.suppress(Exception):  # the backend may be away: the monitor's record still comes
                self._publish(failure_of(doomed))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(expiry.pid, signal.SIGKILL)
