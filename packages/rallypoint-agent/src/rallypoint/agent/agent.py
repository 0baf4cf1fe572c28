"""The elastic agent: one per node, runs the job's workers on that node.

The run loop: rendezvous, assign ranks (every agent computes the whole assignment locally with
the configured strategy), start the workers, then monitor them. Exits are seen as they happen
(a watcher thread per worker), and the rendezvous is checked every ``monitor_interval``:

* all local workers succeeded: the exit barrier (every node done, or ``exit_barrier_timeout``),
  then the rendezvous is closed and the agent exits 0;
* a local worker failed (and no peer host vanished: :mod:`rallypoint.agent.peers`): the failure is
  published, the other local workers are stopped, and the job restarts if the job-wide budget allows;
  otherwise the rendezvous is closed *as failed* and the agent prints one root-cause report;
* the job was closed as failed by another node: the workers are stopped and the agent prints
  the same report and exits 1, like the node that closed it;
* the round is over (a peer failed, left or died) or nodes are waiting: the workers are
  stopped and the agent re-rendezvouses, without spending the restart budget;
* this node lost the rendezvous (its heartbeat could not reach the backend for
  ``heartbeat_timeout``, so its peers dropped it): the workers are stopped and the agent rejoins
  the next round, without spending the restart budget, retrying the backend until the join
  timeout (:mod:`rallypoint.agent.rejoin`); a rendezvous whose state is gone fails the node;
* SIGTERM/SIGINT/SIGHUP: forwarded to the workers, which get ``grace`` seconds before SIGKILL.

A run id is used once: a node that finds its run already closed, or a different job under
it, is refused by the rendezvous and starts no worker (exit 2).

The restart budget is counted for the whole job in the rendezvous store, so
``TORCHELASTIC_RESTART_COUNT`` is the same on every node.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import time
from typing import TYPE_CHECKING, TextIO

from rallypoint.agent import console
from rallypoint.agent import rejoin as rejoining
from rallypoint.agent.agent_store import AgentStore
from rallypoint.agent.attempt import Attempts, Contact
from rallypoint.agent.colour import agent_line
from rallypoint.agent.debug_service import DebugService
from rallypoint.agent.exit_barrier import exit_barrier
from rallypoint.agent.hang_watch import HangWatch
from rallypoint.agent.log_dir import claim, release
from rallypoint.agent.lost_hosts import fatal_losses
from rallypoint.agent.node_share import NodeShare, assign_function, share_of
from rallypoint.agent.notices import NoticeLog
from rallypoint.agent.peers import running_status, vanished_peer
from rallypoint.agent.report import FailureReport
from rallypoint.agent.restart_budget import RESTARTS_KEY, RestartBudget
from rallypoint.agent.settings import AgentResult, AgentSettings, AgentSignal, Outcome, install_signal_handlers
from rallypoint.agent.status_file import StatusFile, keeps_state_here
from rallypoint.agent.waiting import waiting_line
from rallypoint.agent.warm import WarmLauncher
from rallypoint.agent.watchdog_kills import WatchdogKills
from rallypoint.core.errors import RallypointError

if TYPE_CHECKING:
    from rallypoint.core.plugins import RallypointPluginManager
    from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult

__all__ = [
    "ABORT_KEY",
    "RESTARTS_KEY",
    "AgentResult",
    "AgentSettings",
    "ElasticAgent",
    "Outcome",
]

log = logging.getLogger("rallypoint.agent")

ABORT_KEY = "agent/abort"


class ElasticAgent:
    """Runs one node's workers for the whole job.

    Args:
        handler: this node's rendezvous handler (:class:`rallypoint.rendezvous.handler.RendezvousHandler`).
        settings: the job's agent settings.
        pm: plugin manager whose agent hooks fire (``None``: no hooks).
        console: where the agent's own messages go (``sys.stderr`` by default); they are queued
            and written by a thread of their own (:mod:`rallypoint.agent.console`), never waited for.
        warm: the warm launcher of ``settings.preload``, when the caller started it earlier (``rallypoint
            run`` does, before it sets up the rendezvous); the agent closes it when it ends.
    """

    def __init__(
        self,
        handler: RendezvousHandler,
        settings: AgentSettings,
        *,
        pm: RallypointPluginManager | None = None,
        console: TextIO | None = None,
        warm: WarmLauncher | None = None,
    ) -> None:
        self.handler = handler
        if handler.assign is None:  # the node that completes a round assigns every node's ranks, once
            handler.assign = assign_function(settings)
        self.backend = handler.backend
        self.settings = settings
        self.pm = pm
        self.console = console
        self.host = settings.host or socket.gethostname()
        #: Where this run's logs go: ``settings.log_dir``, or a sibling when that holds an earlier run's.
        self.log_dir = settings.log_dir
        self._warm = (
            warm
            if warm is not None
            else WarmLauncher(  # inert if empty
                settings.preload, env=settings.preload_env, console=console, keep=settings.preload_keep
            )
        )
        self._store = AgentStore(self._warm, self.say)  # the workers' store, when the warm process preloads torch
        self._signal: int | None = None
        self._notices = NoticeLog(settings.notice_signals, self.say)  # after a preemption notice: exit 75, requeue
        self.budget = RestartBudget(self.backend, handler.node_id, settings.max_restarts, self.say, pm)
        self.rounds = 0
        self.rejoins = 0  # times this node rejoined after losing the rendezvous
        self._lost: rejoining.Lost | None = None  # set while it rejoins
        self._contact = Contact()  # its last answer from the backend
        self._outcome: Outcome | None = None  # how the current round's workers ended (None: running)
        self._not_shown_said = 0  # console lines not shown since run() began, as last reported
        self._not_shown_before = 0  # ... and the process's count when it began
        self._log_dir_moved = ""  # said once the rendezvous has accepted this node
        self._debug = DebugService(self.backend, handler.node_id, self.host)  # answers `rallypoint debug stacks`
        self._status: StatusFile | None = None  # set in run() when the job's state lives in this process
        self._kills = (  # serves [timer] watchdog timers, kills the workers whose timers expire
            WatchdogKills(settings.watchdog, settings.watchdog_options, self._debug, self.say, self.budget.publish)
            if settings.watchdog is not None
            else None
        )
        self._hangs = HangWatch(  # [debug] hang_timeout, and workers' CollectiveTimeout: the hang report (#40)
            settings.hang_timeout, self._debug, self.backend, handler.node_id, self.host, self.say, self.budget.publish
        )
        #: Runs each attempt's workers (start, monitor, stop) and says how the attempt ended.
        self.attempts = Attempts(
            handler,
            settings,
            host=self.host,
            say=self.say,
            contact=self._contact,
            warm=self._warm,
            store=self._store,
            debug=self._debug,
            hangs=self._hangs,
            kills=self._kills,
            pm=pm,
        )

    # -- messages ----------------------------------------------------------------------------
    def say(self, message: str) -> None:
        """Print one agent message, prefixed so it stands apart from worker output; never blocks."""
        console.message(agent_line(self.host, message, self.console or sys.stderr) + "\n", self.console)

    def _console_settled(self) -> int:
        """Let the console catch up (while it takes text: :func:`console.settle`); lines it did not show."""
        self._not_shown_said = console.settle() - self._not_shown_before
        return self._not_shown_said

    def _claim_log_dir(self) -> bool:
        """Take this run's log directory (:func:`~rallypoint.agent.log_dir.claim`).

        When it moved, where to is said once the rendezvous has accepted this node: a run it
        refuses (a finished run id) starts nothing and leaves no log directory to point at.
        """
        configured = self.settings.log_dir
        self.log_dir, created = claim(configured, self.settings.run_id, shared=self.handler.settings.max_nodes > 1)
        if self.log_dir != configured:
            self._log_dir_moved = f"{configured} holds the logs of an earlier run; this run's logs go to {self.log_dir}"
        return created

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> AgentResult:
        """Run the job on this node until it succeeds, fails or a signal stops it.

        The console gets the time it takes to show what is queued, as long as it takes text; the
        last message counts the lines it did not show (:attr:`AgentResult.console_not_shown`).

        Raises:
            RendezvousFinishedError: the run id belongs to a job that already ended.
            RendezvousJobMismatchError: a different job uses the run id.
            RallypointError: another node ended the job with an error (e.g. rank assignment).
            LogDirError: another user could write or redirect the log directory (before anything starts).
        """
        self._not_shown_before = console.not_shown()
        created = self._claim_log_dir()
        try:
            result = self._run()
        except BaseException:  # e.g. refused by the rendezvous: a run that never started leaves no log directory
            if self.handler.settings.max_nodes == 1:
                release(self.log_dir, created)
            raise
        said = self._not_shown_said
        result.console_not_shown = self._console_settled()
        if result.console_not_shown > said:
            self.say(
                f"console: {result.console_not_shown} line(s) not shown (it did not keep up, or was closed); "
                f"the log files under {self.log_dir} have every line of worker output"
            )
        return result

    def _run(self) -> AgentResult:
        from rallypoint.rendezvous.errors import RendezvousHeartbeatError

        notices = self._notices
        restore = install_signal_handlers(self.settings.signals, self.settings.ignored_signals, notices.outlive)
        try:
            self._warm.start()  # with modules to preload, the warm process imports them while the rendezvous runs
            if self._kills is not None:
                self._kills.start(self.log_dir)
            self._debug.start(self.log_dir)
            if keeps_state_here(self.backend):  # nothing outside this process can read the job: status.json
                self._status = StatusFile(self.backend, self.settings.run_id, self.log_dir)
            result = self._loop()
            result.exit_code = notices.after_run(result.exit_code)
            return result
        except AgentSignal as sig:
            if not sig.announced:  # between attempts: no worker of this node runs
                self.say(f"received {sig}; stopping (no worker was running)")
            return AgentResult(notices.after_signal(sig.signum), rounds=self.rounds)
        except RendezvousHeartbeatError as exc:
            self.say(f"this node fails, its workers were stopped: {exc}")
            return AgentResult(1, rounds=self.rounds)
        finally:
            if self.attempts.group is not None:
                self.attempts.group.stop(grace=self.settings.stop_grace)
            self._store.stop()
            self._warm.close()
            self._debug.stop()
            if self._status is not None:
                self._status.update()  # how the job ended
            with contextlib.suppress(Exception):
                self.handler.shutdown()
            if self._kills is not None:
                self._kills.stop()
            restore()

    def _loop(self) -> AgentResult:
        from rallypoint.rendezvous.errors import (
            RendezvousBackendError,
            RendezvousClosedError,
            RendezvousFinishedError,
            RendezvousHeartbeatError,
        )

        while True:
            try:
                result = self._next_round()
            except RendezvousFinishedError:
                raise  # the run had ended before this node came: refused, no worker started
            except RendezvousClosedError:
                return self._after_close()
            except rejoining.RejoinTimedOut as exc:
                return self._rejoin_failed(exc)
            except (RendezvousBackendError, RendezvousHeartbeatError) as exc:
                # lost while waiting for a round, or not reached yet: waited for, up to the join
                # timeout (the agent that serves it may start after this one)
                if not rejoining.lost_contact(exc):
                    raise
                if self.rounds == 0 and isinstance(exc, RendezvousBackendError) and self._lost is None:
                    self._await_first_contact(exc)
                else:
                    self._lose(None, exc)
                continue
            try:
                ended = self._round(result)
            except (RendezvousBackendError, RendezvousHeartbeatError) as exc:
                if not rejoining.lost_contact(exc):
                    raise
                self._lose(result.round, exc)
                continue
            if ended is not None:
                return ended

    def _next_round(self) -> RendezvousResult:
        """The next round: joined as usual, or rejoined after this node lost the rendezvous."""
        lost = self._lost
        with waiting_line(self.handler, self.console or sys.stderr):
            result = self.handler.next_rendezvous() if lost is None else rejoining.rejoin(self.handler, lost)
        self._contact.touch()
        if self._log_dir_moved:  # accepted: the run goes on, its logs go there
            self.say(self._log_dir_moved)
            self._log_dir_moved = ""
        if lost is not None and lost.first:
            self._lost = None
            self.say(rejoining.reached_message(self._contact.last - lost.started))
        elif lost is not None:
            self._lost = None
            self.rejoins += 1
            self.say(
                f"rejoined the job in round {result.round} ({result.num_nodes} node(s)), "
                f"{self._contact.last - lost.started:.1f}s after it started rejoining"
            )
        return result

    def _round(self, result: RendezvousResult) -> AgentResult | None:
        """Run one round's workers; the agent's result when the job ended, ``None`` for the next round."""
        self.rounds += 1
        restarts = self.budget.used()
        self._outcome = None
        assignment = self._assign_or_abort(result)
        end = self.attempts.run(result, assignment, restarts, log_dir=self.log_dir, status=self._status)
        self._outcome = outcome = end.outcome
        if outcome is Outcome.SUCCEEDED:
            outcome = exit_barrier(self.handler, result, self.settings.exit_barrier_timeout, self.say)
            if outcome is Outcome.SUCCEEDED:
                if not self._close(f"job succeeded (closed by node {self.handler.node_id!r})", round_=result.round):
                    self.say(rejoining.superseded_message(result.round, "finished"))
                    return None
                if not self._notices.outlived:  # else the workers ended on a notice: said when the agent exits
                    self.say(f"job {self.settings.run_id!r} succeeded")
                return self._result(0, restarts=restarts)
        if outcome is Outcome.CLOSED:
            return self._after_close()
        if outcome is Outcome.MEMBERSHIP and repr(self.handler.node_id) in end.reason:
            # the backend answers again, but this node's peers took it for dead meanwhile
            self.say(rejoining.dropped_message(result.round, end.reason, end.gap))
            return None
        why = vanished_peer(self.handler, result) if outcome is Outcome.FAILED else "membership changed"
        if why is None:
            status = running_status(self.handler)
            if status is not None and status.superseded:  # the job went on without this node
                self.say(rejoining.superseded_message(result.round, "failed"))
                return None
            self.budget.record(end.failures)
            if self.budget.may_restart(result.round, end.failures):
                return None
            reason = f"job failed after {restarts} of {self.settings.max_restarts} restart(s)"
            if not self._close(f"{reason} (closed by node {self.handler.node_id!r})", failed=True, round_=result.round):
                self.say(rejoining.superseded_message(result.round, "failed"))
                return None
            return self._fail(restarts)
        if self.settings.fixed_allocation and (
            lost := fatal_losses(self.handler, result, assignment.whole(), restarts, self.settings.fixed_allocation)
        ):
            self.budget.record(lost)  # a lost host of a fixed allocation: no one will take its place
            self._close(f"job failed: {lost[0].reason} (closed by node {self.handler.node_id!r})", failed=True)
            return self._fail(restarts)
        self.say(f"round {result.round} is over ({why}); re-rendezvous, no restart counted")
        return None

    def _lose(self, round_: int | None, exc: BaseException) -> None:
        """Lost the rendezvous: say so once, and rejoin (no restart counted).

        A rendezvous that lived in another node's agent (see :func:`rejoining.hosted_by`) is given
        up once that agent is gone (its port refuses connections): so is the job's state.
        """
        workers = rejoining.workers_fate(self._outcome if round_ is not None else Outcome.MEMBERSHIP)
        server = rejoining.hosted_by(self.backend)
        self._lost = rejoining.Lost(round_, self._contact.last, time.monotonic(), workers, server=server)
        self._outcome = None
        self.say(rejoining.lost_message(self._lost, exc, self._endpoint(), self.handler.timeouts.join))

    def _await_first_contact(self, exc: BaseException) -> None:
        """The rendezvous did not answer this node's first contact: wait for it until the join timeout."""
        contact = self._contact.last
        self._lost = rejoining.Lost(None, contact, contact, "no worker ran", first=True)
        self.say(rejoining.waiting_message(exc, self._endpoint(), self.handler.timeouts.join))

    def _endpoint(self) -> str:
        return self.settings.rendezvous_endpoint or type(self.backend).__name__

    def _rejoin_failed(self, exc: rejoining.RejoinTimedOut) -> AgentResult:
        """The backend did not answer again within the join timeout (or its agent is gone): this node fails."""
        lost = self._lost
        if lost is not None and exc.gone:
            self.say(rejoining.server_lost_message(lost, exc))
        else:
            first = lost is not None and lost.first
            self.say(rejoining.rejoin_failed_message(exc, self._endpoint(), self.handler.timeouts.join, first=first))
        return self._result(1)

    def _result(self, exit_code: int, report: FailureReport | None = None, *, restarts: int = 0) -> AgentResult:
        return AgentResult(exit_code, report, rounds=self.rounds, restarts=restarts, rejoins=self.rejoins)

    def _assign_or_abort(self, result: RendezvousResult) -> NodeShare:
        try:
            return self._assign(result)
        except RallypointError as exc:
            # Every node computes the same assignment, so every node fails the same way:
            # end the job for all of them instead of leaving them waiting for this one.
            self.backend.set(ABORT_KEY, {"node": self.handler.node_id, "error": str(exc), "exit_code": exc.exit_code})
            self._close(f"node {self.handler.node_id!r} could not assign ranks", failed=True)
            raise

    def _close(self, reason: str, *, failed: bool = False, round_: int | None = None) -> bool:
        """Close the rendezvous for every node, saying why (and whether the job failed).

        With ``round_``, only while it is the current round: ``False`` when a newer round has
        opened (this node was dropped meanwhile), and nothing was closed.
        """
        try:
            return self.handler.set_closed(reason, failed=failed, round_=round_)
        except Exception as exc:  # noqa: BLE001 - the outcome here stands; the others must be told
            self.say(f"could not close the rendezvous ({type(exc).__name__}: {exc}); other nodes may not notice")
            return True

    def _assign(self, result: RendezvousResult) -> NodeShare:
        """The node's ranks: received with its seat, or computed (:mod:`~rallypoint.agent.node_share`)."""
        return share_of(self.settings, result)

    def _fail(self, restarts: int, *, closed_by: str | None = None) -> AgentResult:
        """Print (and save) the job's root-cause report; exit 1.

        Args:
            restarts: restarts the job used.
            closed_by: why another node closed the job (printed after the report); ``None``:
                this node closed it as failed (every other node then prints the same report).
        """
        report = self.budget.report(self.settings.run_id, restarts)
        report.console_not_shown = self._console_settled()
        saved = report.save(self.log_dir / "failure.json")  # never raises: the console report comes first
        tail = f"\n{closed_by}; this node's workers were stopped" if closed_by else ""
        self.say("job failed\n" + report.format() + f"\n\n{saved}" + tail)
        return self._result(1, report, restarts=restarts)

    def _after_close(self) -> AgentResult:
        """Another node closed the job: this node ends the way the job did.

        Closed as failed: the same root-cause report, exit 1 (the error of an aborting node is
        raised). Closed as succeeded: exit 0 for a node that never got a place in the job (it
        waited while the others finished) and for a node that was dropped (it lost the
        rendezvous) and was rejoining: the job's outcome is success, and the message says that
        this node did no work after it was dropped. A member whose workers had not finished
        exits 1.
        """
        restarts = self.budget.used()
        abort = self.backend.get(ABORT_KEY)
        if abort is not None:
            value = abort.value if isinstance(abort.value, dict) else {}
            error = RallypointError(f"node {value.get('node')!r} ended the job: {value.get('error')}")
            error.exit_code = int(value.get("exit_code") or 1)
            raise error
        status = self.handler.round_status()
        reason = status.reason or "closed by another node"
        if status.failed:
            return self._fail(restarts, closed_by=reason)
        if self.rounds == 0:
            self.say(
                f"job {self.settings.run_id!r} ended ({reason}) while this node waited for a place in it; "
                "no worker ran here"
            )
            return self._result(0, restarts=restarts)
        if self._lost is not None:
            self.say(rejoining.succeeded_without_message(self.settings.run_id, reason, self._lost))
            return self._result(0, restarts=restarts)
        self.say(f"job {self.settings.run_id!r} was closed ({reason}) before this node's workers finished")
        return self._result(1, restarts=restarts)
