"""One attempt on one node: start the round's workers, watch them until the attempt ends, stop them.

The agent (:mod:`rallypoint.agent.agent`) decides what a round's end means for the job (the exit
barrier, a restart, a re-rendezvous, the failure report); :class:`Attempts` runs the workers of one
attempt and says how it ended:

* before the workers start: this node's previous rank is published for the strategies, the
  attempt's log directory is made, the workers' env:// store is prepared (served by the agent's warm
  process when it preloads torch, :mod:`rallypoint.agent.agent_store`), and the workers' specs are
  built (:mod:`rallypoint.agent.worker_specs`);
* while they run: their exits are seen as they happen, the rendezvous is read once per
  ``monitor_interval`` (closed as failed by another node, nodes waiting), the hang watch and the
  watchdog timers follow the group, and the fence stops the workers when this node loses the
  rendezvous (:mod:`rallypoint.agent.fence`);
* at the end: the workers are stopped (a signal is forwarded to them) and a failed attempt's
  failures are recorded, the root cause first (:mod:`rallypoint.agent.worker_failure`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rallypoint.agent.agent_store import AgentStore
from rallypoint.agent.debug_service import DebugService
from rallypoint.agent.fence import Fence
from rallypoint.agent.hang_watch import HangWatch
from rallypoint.agent.line_prefix import prefix_of
from rallypoint.agent.log_dir import private_dir
from rallypoint.agent.logs import WorkerLogs, tee_selects
from rallypoint.agent.node_share import NodeShare
from rallypoint.agent.peers import round_stands, running_status
from rallypoint.agent.ranks import WorkerRanks
from rallypoint.agent.report import WorkerFailure
from rallypoint.agent.settings import AgentSettings, AgentSignal, Outcome
from rallypoint.agent.status_file import StatusFile
from rallypoint.agent.warm import WarmLauncher
from rallypoint.agent.watchdog_kills import WatchdogKills
from rallypoint.agent.worker_failure import failure_record, failures_of_attempt
from rallypoint.agent.worker_specs import AttemptWorkers, attempt_workers
from rallypoint.agent.workers import WorkerExit, WorkerGroup

if TYPE_CHECKING:
    from rallypoint.core.plugins import RallypointPluginManager
    from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult

__all__ = ["AttemptEnd", "Attempts", "Contact"]


@dataclass
class Contact:
    """When this node last had an answer from the rendezvous backend (monotonic seconds).

    The agent touches it when a round is joined, the attempt's monitor at each read of the
    rendezvous; a node that loses the rendezvous says how long it had not heard from it.
    """

    last: float = field(default_factory=time.monotonic)

    def touch(self) -> float:
        """Record an answer now; the seconds since the previous one."""
        now = time.monotonic()
        gap, self.last = now - self.last, now
        return gap


@dataclass
class AttemptEnd:
    """How one attempt ended.

    Attributes:
        outcome: succeeded, failed, closed by another node, or membership changed.
        failures: a failed attempt's worker failures, the root cause first (empty otherwise).
        reason: the round header's reason when the monitor saw the round over (``MEMBERSHIP``).
        gap: how long the backend had not answered before that read.
    """

    outcome: Outcome
    failures: list[WorkerFailure] = field(default_factory=list)
    reason: str = ""
    gap: float = 0.0


class Attempts:
    """Runs this node's attempts, one at a time, for the agent.

    Args:
        handler: this node's rendezvous handler.
        settings: the job's agent settings.
        host: this node's host name (console prefixes, failure records).
        say: the agent's console message function.
        contact: the agent's record of the backend's last answer (the monitor touches it).
        warm: the warm launcher (workers start from it when it preloads).
        store: the workers' env:// store served by the agent, when it can.
        debug: answers ``rallypoint debug stacks``; follows each attempt's workers.
        hangs: the hang watch (``[debug] hang_timeout`` and workers' collective timeouts).
        kills: the watchdog timers' server, or ``None`` when ``[timer] watchdog`` is off.
        pm: plugin manager whose agent hooks fire (``None``: no hooks).
    """

    def __init__(
        self,
        handler: RendezvousHandler,
        settings: AgentSettings,
        *,
        host: str,
        say: Callable[[str], None],
        contact: Contact,
        warm: WarmLauncher,
        store: AgentStore,
        debug: DebugService,
        hangs: HangWatch,
        kills: WatchdogKills | None,
        pm: RallypointPluginManager | None = None,
    ) -> None:
        self.handler = handler
        self.settings = settings
        self.host = host
        self.say = say
        self.contact = contact
        self.warm = warm
        self.store = store
        self.debug = debug
        self.hangs = hangs
        self.kills = kills
        self.pm = pm
        #: The running attempt's workers (``None`` between attempts).
        self.group: WorkerGroup | None = None

    def run(
        self,
        result: RendezvousResult,
        assignment: NodeShare,
        attempt: int,
        *,
        log_dir: Path,
        status: StatusFile | None = None,
    ) -> AttemptEnd:
        """Run attempt number ``attempt`` of round ``result`` until it ends; its workers are stopped then.

        Args:
            result: the round this node joined.
            assignment: the round's ranks (this node's share and the whole job's).
            attempt: restarts used so far (``attempt_N`` log directories, ``TORCHELASTIC_RESTART_COUNT``).
            log_dir: this run's log directory.
            status: the job's status file, when this process keeps the job's state (updated once
                the workers have started).

        Raises:
            AgentSignal: a signal came; it was forwarded to the workers, which were stopped.
            RendezvousHeartbeatError: this node lost the rendezvous (the fence stopped its workers).
        """
        node_id = result.node.node_id
        workers, logs, attempt_dir, agent_store = self._prepare(result, assignment, attempt, log_dir)
        contexts = workers.ranks
        group = WorkerGroup(logs=logs, warm=self.warm)
        self.group = group
        self.debug.follow(group, {rank: w.local_rank for rank, w in contexts.items()}, attempt_dir / "debug")
        # Without an agent store, worker rank 0 serves the env:// store. torch's clients back off for
        # about half a second when they find no server yet, so the store's worker starts a moment
        # before the others.
        head_start = (
            self.settings.store_head_start if 0 in contexts and len(workers.specs) > 1 and not agent_store else 0.0
        )

        def failure_of(ex: WorkerExit) -> WorkerFailure:
            return self.failure(ex, contexts[ex.rank], logs, attempt_dir, attempt, node_id)

        try:  # a signal may come while the workers start: those started are stopped with it
            group.start(workers.specs, head_start=head_start)
            if status is not None:
                status.update()
            if self.kills is not None:
                self.kills.follow(group, failure_of)
            self.hangs.follow(group, result.round, attempt_dir, workers.progress, failure_of)
            if self.pm is not None:
                self.pm.hook.rallypoint_agent_workers_started(group=group)
            poll = min(0.5, max(0.05, self.handler.timeouts.heartbeat_interval / 4))
            with Fence(self.handler, group, grace=self.settings.stop_grace, say=self.say, poll=poll):
                end, bad = self._monitor(group)
            stop_time = time.time()
            exits = group.stop(grace=self.settings.stop_grace)
            logs.close()
            if end.outcome is Outcome.FAILED:
                end.failures = failures_of_attempt(exits, bad, stop_time, failure_of)
                if self.pm is not None:
                    for f in end.failures:
                        self.pm.hook.rallypoint_agent_worker_failed(failure=f)
            return end
        except AgentSignal as sig:
            self.say(f"received {sig}; stopping workers")
            sig.announced = True
            group.stop(grace=self.settings.stop_grace, sig=sig.signum)
            logs.close()
            raise
        except BaseException:
            group.stop(grace=self.settings.stop_grace)  # e.g. this node's heartbeat failed
            logs.close()
            raise
        finally:
            self.group = None
            self.hangs.close()
            if self.kills is not None:
                self.kills.follow(None)

    def _prepare(
        self, result: RendezvousResult, assignment: NodeShare, attempt: int, log_dir: Path
    ) -> tuple[AttemptWorkers, WorkerLogs, Path, bool]:
        """Everything the attempt's workers need before they start, and the console told what they run.

        Returns:
            The workers' specs and ranks, their logs, the attempt's directory, and whether the
            agent serves their store.
        """
        node_id = result.node.node_id
        # published with this node's next join, so that strategies can keep its ranks stable
        self.handler.update_node(previous_rank=min(w.rank for w in assignment.for_node(node_id)))
        attempt_dir = private_dir(log_dir / f"attempt_{attempt}")
        # the previous attempt's store served its workers until they all ended, the exit barrier too
        self.store.stop()
        agent_store = self.store.prepare(
            assignment.store.master_addr,
            assignment.store.master_port,
            serve=any(w.rank == 0 for w in assignment.workers),
            log=attempt_dir / "store.log",
            round_on=round_stands(self.handler),
        )
        workers = attempt_workers(
            self.settings,
            result,
            assignment,
            attempt=attempt,
            attempt_dir=attempt_dir,
            host=self.host,
            pm=self.pm,
            watchdog_env=self.kills.worker_env if self.kills is not None else None,
            agent_store=agent_store,
        )
        prefixes = {r: prefix_of(self.settings.line_prefix, self.host, w) for r, w in workers.ranks.items()}
        logs = WorkerLogs(log_dir, attempt, host=self.host, tee=self.settings.tee, prefixes=prefixes)
        self._announce(result, assignment, sorted(workers.ranks), workers.store, attempt, log_dir)
        return workers, logs, attempt_dir, agent_store

    def failure(
        self, ex: WorkerExit, ranks: WorkerRanks, logs: WorkerLogs, attempt_dir: Path, attempt: int, node_id: str
    ) -> WorkerFailure:
        """The failure record of worker exit ``ex``, explained by a watchdog kill or a hang when one caused it."""

        def explain(ex: WorkerExit) -> tuple[str, float] | None:
            return (self.kills.explain(ex) if self.kills is not None else None) or self.hangs.explain(ex)

        return failure_record(
            ex, ranks, logs, attempt_dir, attempt=attempt, node_id=node_id, host=self.host, explain=explain
        )

    def _announce(
        self, result: RendezvousResult, assignment: NodeShare, ranks: list[int], store: str, attempt: int, log_dir: Path
    ) -> None:
        """Tell the console what this attempt runs, and warn once when ``tee`` selects no rank."""
        self.say(
            f"round {result.round}, attempt {attempt}: {result.num_nodes} node(s), {assignment.world_size} "
            f"worker(s); group rank {result.group_rank} runs ranks {ranks}; store {store}"
        )
        tee = self.settings.tee
        if (
            attempt == 0
            and isinstance(tee, tuple)
            and not any(tee_selects(tee, r) for r in range(assignment.world_size))
        ):
            self.say(
                f"tee {list(tee)} selects no rank of this job (ranks 0..{assignment.world_size - 1}): "
                f"no worker output reaches the console; the log files under {log_dir} have all of it"
            )

    def _monitor(self, group: WorkerGroup) -> tuple[AttemptEnd, WorkerExit | None]:
        """Watch the workers and the rendezvous until the attempt ends; the failed worker's exit, if one failed."""
        interval = self.settings.monitor_interval
        total = len(group.pids)
        while True:
            ex = group.wait_any(timeout=interval)
            failure = self.handler.failure  # this node lost the rendezvous: its workers were fenced
            if failure is not None:
                raise failure
            self.hangs.check()  # a few system calls; acts on a hang
            if ex is not None:
                if not ex.ok:
                    return AttemptEnd(Outcome.FAILED), ex
                if len(group.exits) == total and all(e.ok for e in group.exits.values()):
                    return AttemptEnd(Outcome.SUCCEEDED), None
                continue
            # one read per interval: closed as failed by another node, or nodes waiting / round over
            # (a job closed as succeeded lets the workers here finish: the exit barrier waits for them)
            status = running_status(self.handler)
            if status is None:
                continue  # the backend did not answer: the workers go on, the heartbeat decides
            gap = self.contact.touch()
            if status.closed and status.failed:
                return AttemptEnd(Outcome.CLOSED), None
            if status.waiting > 0:
                return AttemptEnd(Outcome.MEMBERSHIP, reason=status.reason, gap=gap), None
