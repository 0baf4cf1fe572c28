"""The job-wide restart budget, and the worker failures it is spent on, kept in the rendezvous store.

Every node reads and writes the same keys, so ``TORCHELASTIC_RESTART_COUNT`` is the same on every
node and the failure report is the same wherever it is printed:

* ``agent/restarts``: restarts the job has used (an atomic counter);
* ``agent/restart-claim/<round>``: the node that decides, once per round, whether the job
  restarts after a failure (the first to claim it; the others learn the outcome from the
  rendezvous: a new round, or the job closed as failed);
* ``agent/failures/<attempt>/<node>/<rank>``: each worker failure, for the root-cause report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rallypoint.agent.report import FailureReport, WorkerFailure, failures_from_store

if TYPE_CHECKING:
    from rallypoint.core.plugins import RallypointPluginManager
    from rallypoint.rendezvous.backend import RendezvousBackend

__all__ = ["FAILURES_PREFIX", "RESTARTS_KEY", "RestartBudget"]

RESTARTS_KEY = "agent/restarts"
FAILURES_PREFIX = "agent/failures/"


def _claim_key(round_: int) -> str:
    return f"agent/restart-claim/{round_}"


class RestartBudget:
    """One node's view of the job's restart budget and failure records.

    Args:
        backend: the rendezvous backend (the job's shared store).
        node_id: this node's id (it claims decisions under it).
        max_restarts: the job's budget (``agent.max_restarts``).
        say: prints one agent line.
        pm: plugin manager whose ``rallypoint_agent_should_restart`` hooks decide first (``None``: none).
    """

    def __init__(
        self,
        backend: RendezvousBackend,
        node_id: str,
        max_restarts: int,
        say: Callable[[str], None],
        pm: RallypointPluginManager | None = None,
    ) -> None:
        self.backend = backend
        self.node_id = node_id
        self.max_restarts = max_restarts
        self._say = say
        self._pm = pm

    def used(self) -> int:
        """Restarts the job has used so far."""
        entry = self.backend.get(RESTARTS_KEY)
        return int(entry.value) if entry is not None else 0

    def publish(self, failure: WorkerFailure) -> None:
        """Publish one worker failure for every node's report (a later one of the same worker replaces it)."""
        self.backend.set(f"{FAILURES_PREFIX}{failure.attempt}/{failure.node_id}/{failure.rank}", failure.to_json())

    def record(self, failures: Sequence[WorkerFailure]) -> None:
        """Publish this node's worker failures (for every node's report) and print their headlines."""
        for f in failures:
            self.publish(f)
        for f in failures:
            self._say(f"worker {f.headline()}")

    def may_restart(self, round_: int, failures: Sequence[WorkerFailure]) -> bool:
        """Decide (once per round, job-wide) whether the job restarts after a failure; spends one if so."""
        decision: Any = None
        if self._pm is not None and failures:
            decision = self._pm.hook.rallypoint_agent_should_restart(failure=failures[0])
        claimed, _ = self.backend.compare_and_set(_claim_key(round_), self.node_id, version=None)
        if not claimed:
            return True  # another node already decided for this round; the rendezvous tells us the rest
        if decision is False:
            self._say("a rallypoint_agent_should_restart hook declined the restart")
            return False
        if decision is None and self.used() >= self.max_restarts:
            return False
        count = self.backend.add(RESTARTS_KEY, 1)
        self._say(f"restarting the job ({count} of {self.max_restarts} restart(s) used)")
        return True

    def report(self, run_id: str, restarts: int) -> FailureReport:
        """The job's root-cause report, from every node's published failures."""
        entries = self.backend.list(FAILURES_PREFIX)
        failures = failures_from_store([e.value for e in entries.values()])
        return FailureReport.build(run_id, failures, restarts=restarts, max_restarts=self.max_restarts)
