"""The job's state that every node shares through the rendezvous store, and the decisions made on it.

The restart budget is counted here for the whole job (so ``TORCHELASTIC_RESTART_COUNT`` is the
same on every node), each node publishes its workers' failures here (so the report names the first
failure across all nodes), the exit barrier counts the nodes that finished, and a node whose rank
assignment failed leaves its error here for the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rallypoint.agent.report import FailureReport, WorkerFailure, failures_from_store
from rallypoint.agent.settings import AgentSettings, Outcome

if TYPE_CHECKING:
    from rallypoint.core.plugins import RallypointPluginManager
    from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult

__all__ = ["ABORT_KEY", "FAILURES_PREFIX", "RESTARTS_KEY", "JobState"]

RESTARTS_KEY = "agent/restarts"
ABORT_KEY = "agent/abort"
FAILURES_PREFIX = "agent/failures/"


def _restart_claim_key(round_: int) -> str:
    return f"agent/restart-claim/{round_}"


def _done_key(round_: int) -> str:
    return f"agent/done/{round_}"


class JobState:
    """The job-wide keys of one node's rendezvous.

    Args:
        handler: this node's rendezvous handler.
        settings: the job's agent settings (run id, restart budget, exit barrier timeout).
        say: prints one agent message.
        pm: plugin manager whose ``rallypoint_agent_should_restart`` hook decides restarts (``None``: none).
    """

    def __init__(
        self,
        handler: RendezvousHandler,
        settings: AgentSettings,
        say: Callable[[str], None],
        pm: RallypointPluginManager | None = None,
    ) -> None:
        self.handler = handler
        self.backend = handler.backend
        self.settings = settings
        self.say = say
        self.pm = pm

    def restarts(self) -> int:
        """Restarts the job has used."""
        entry = self.backend.get(RESTARTS_KEY)
        return int(entry.value) if entry is not None else 0

    def publish(self, failures: list[WorkerFailure]) -> None:
        """Publish this node's failures for every node's report, and say them."""
        for f in failures:
            key = f"{FAILURES_PREFIX}{f.attempt}/{f.node_id}/{f.rank}"
            self.backend.set(key, f.to_json())
        for f in failures:
            self.say(f"worker {f.headline()}")

    def may_restart(self, result: RendezvousResult, failures: list[WorkerFailure]) -> bool:
        """Decide (once per round, job-wide) whether the job restarts after a failure."""
        decision = None
        if self.pm is not None and failures:
            decision = self.pm.hook.rallypoint_agent_should_restart(failure=failures[0])
        claimed, _ = self.backend.compare_and_set(_restart_claim_key(result.round), self.handler.node_id, version=None)
        if not claimed:
            return True  # another node already decided for this round; the rendezvous tells us the rest
        if decision is False:
            self.say("a rallypoint_agent_should_restart hook declined the restart")
            return False
        used = self.restarts()
        if decision is None and used >= self.settings.max_restarts:
            return False
        count = self.backend.add(RESTARTS_KEY, 1)
        self.say(f"restarting the job ({count} of {self.settings.max_restarts} restart(s) used)")
        return True

    def exit_barrier(self, result: RendezvousResult) -> Outcome:
        """Wait until every node's workers finished.

        Returns:
            ``SUCCEEDED`` when they did (or the barrier timed out), ``MEMBERSHIP`` when the round
            restarted meanwhile, ``CLOSED`` when another node closed the job as failed.
        """
        key = _done_key(result.round)
        self.backend.add(key, 1)
        deadline = time.monotonic() + self.settings.exit_barrier_timeout
        while True:
            entry = self.backend.get(key)
            if entry is not None and int(entry.value) >= result.num_nodes:
                return Outcome.SUCCEEDED
            # one read of the header decides: a close by another node between two reads was
            # taken for a membership change (and a finished job for a failed one)
            status = self.handler.round_status()
            if status.closed:
                return Outcome.CLOSED if status.failed else Outcome.SUCCEEDED
            if status.superseded:
                return Outcome.MEMBERSHIP
            left = deadline - time.monotonic()
            if left <= 0:
                self.say(
                    f"exit barrier: {int(entry.value) if entry else 0} of {result.num_nodes} node(s) finished "
                    f"within {self.settings.exit_barrier_timeout:g}s; exiting anyway"
                )
                return Outcome.SUCCEEDED
            self.backend.watch(key, version=entry.version if entry else None, timeout=min(left, 0.5))

    def report(self, restarts: int) -> FailureReport:
        """The job's failure report, from the failures every node published."""
        entries = self.backend.list(FAILURES_PREFIX)
        failures = failures_from_store([e.value for e in entries.values()])
        return FailureReport.build(
            self.settings.run_id, failures, restarts=restarts, max_restarts=self.settings.max_restarts
        )
