"""Hangs the agent notices on its own: no progress for ``[debug] hang_timeout``, or a worker's CollectiveTimeout.

The agent's monitor calls :meth:`HangWatch.check` once per ``monitor_interval``. A check that
finds nothing costs a few system calls: per running worker, two short reads of its flight
record's header and last slot (:class:`~rallypoint.agent.debug_flight.FlightMark`) and the size
of its progress files (:class:`~rallypoint.core.config.ProgressFile`: ``[timer] timeline``);
and one ``stat`` of the workers' debug directory, where a worker that raised
:class:`~rallypoint.collectives.CollectiveTimeout` asks for the report
(:mod:`rallypoint.collectives.hang_request`). Nothing is read whole.

*Progress* is a collective that starts or completes, or a timeline event written. The clock
starts at the attempt's first progress (start-up, imports and loading a checkpoint are not
judged). When none of this node's running workers progresses for ``hang_timeout`` seconds from
then, or a worker asks:

1. the agent claims the round's hang report (``debug/hang-claim/<round>``, the first node to
   claim it gathers; every node of a hung job sees the hang at about the same time);
2. the claiming agent gathers the report from every node while the hang is still there
   (:meth:`~rallypoint.agent.debug_service.DebugService.report_hang`): ``hang_report.txt`` next
   to ``failure.json`` on every node, and the diagnosis line published under the claim;
3. for no progress, it publishes each local worker's failure (dated when the hang was seen,
   the diagnosis in its reason) and kills the workers' process groups: the attempt fails, and the
   restart budget applies as to any failure. The other nodes learn it from the rendezvous;
4. a worker that asked gets its answer (``rank_<R>.hang.done``: the diagnosis) once the
   diagnosis is known, here or from the node that claimed, and then raises its timeout; its
   failure's reason carries the diagnosis.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rallypoint.agent.debug_flight import FlightMark
from rallypoint.agent.workers import WorkerExit
from rallypoint.core.config import format_duration
from rallypoint.rendezvous.keyspace import debug_hang_claim_key

if TYPE_CHECKING:
    from rallypoint.agent.debug_service import DebugService
    from rallypoint.agent.report import WorkerFailure
    from rallypoint.agent.workers import WorkerGroup
    from rallypoint.rendezvous.backend import RendezvousBackend

__all__ = ["ANSWER_SUFFIX", "ANSWER_WAIT", "REQUEST_SUFFIX", "HangWatch"]

#: A worker's request for the hang report: ``<debug dir>/rank_<R>.hang`` (JSON: ``why``, ``time``).
REQUEST_SUFFIX = ".hang"
#: The agent's answer next to it: ``rank_<R>.hang.done`` (JSON: ``diagnosis``).
ANSWER_SUFFIX = ".done"
#: How long a node that did not claim the report waits for the claimer's diagnosis before it
#: answers its workers without one.
ANSWER_WAIT = 15.0
#: A directory modified this recently is listed again even if its time did not change (the
#: kernel's file times are coarse: two changes within one tick share a time).
_RECENT_NS = 1_000_000_000

FailureOf = Callable[[WorkerExit], "WorkerFailure"]


class _Worker:
    """What shows one worker's progress: its flight record's mark and its progress files' sizes."""

    __slots__ = ("files", "flight", "last")

    def __init__(self, flight: Path, files: Sequence[Path]) -> None:
        self.flight = FlightMark(flight)
        self.files = tuple(files)
        self.last: tuple[int, int, float, int] | None = None

    def moved(self) -> bool:
        """Whether it progressed since the last call (a first collective or event is progress)."""
        count, done, end = self.flight.read()
        size = 0
        for path in self.files:
            with contextlib.suppress(OSError):
                size += os.stat(path).st_size
        mark = (count, done, end, size)
        moved = mark != (self.last or (0, 0, 0.0, 0))
        self.last = mark
        return moved


class HangWatch:
    """Watches one node's workers for hangs, and gathers the report when there is one.

    Args:
        timeout: ``[debug] hang_timeout`` in seconds; ``0``: only workers' requests are served.
        debug: this node's debug service (gathers the report).
        backend: the run's key space (the claim).
        node_id: this node's id; ``host``: its host name (in messages).
        say: prints one agent line.
        publish: publishes one worker failure for every node's report (not printed).
        clock: the monotonic clock (tests pass their own).
    """

    def __init__(
        self,
        timeout: float,
        debug: DebugService,
        backend: RendezvousBackend,
        node_id: str,
        host: str,
        say: Callable[[str], None],
        publish: Callable[[WorkerFailure], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout, self._clock = timeout, clock
        self._debug, self._backend, self._say, self._publish = debug, backend, say, publish
        self.node_id, self.host = node_id, host
        self._group: WorkerGroup | None = None
        self._failure_of: FailureOf | None = None
        self._dir: Path | None = None
        self._round = 0
        self._reset()

    def _reset(self) -> None:
        self._workers: dict[int, _Worker] = {}
        self._since: float | None = None  # the last progress; None: none yet (starting up)
        self._dir_mtime = -1
        self._handled: set[str] = set()
        self._waiting: dict[int, Path] = {}  # rank -> its request, not answered yet
        self._asked: set[int] = set()  # ranks that asked this attempt
        self._claim: str | None = None  # "mine" or "theirs" once this round's report is claimed
        self._claimed_at = 0.0
        self._next_look = 0.0
        self.diagnosis: str | None = None  # this attempt's hang diagnosis, once known
        self._killed: dict[int, float] = {}  # pid -> when the hang was seen

    # -- following an attempt --------------------------------------------------------------------
    def follow(
        self,
        group: WorkerGroup,
        round_: int,
        attempt_dir: Path,
        progress: Mapping[int, Sequence[Path]],
        failure_of: FailureOf,
    ) -> None:
        """Watch ``group``'s workers from now on.

        Args:
            group: the attempt's workers.
            round_: its rendezvous round (names the claim).
            attempt_dir: the attempt's directory: the workers' hooks write into its ``debug/``
                (flight records, requests).
            progress: each worker's files whose growth is progress, by rank (the sections'
                :class:`~rallypoint.core.config.ProgressFile` values: ``[timer] timeline``).
            failure_of: builds the failure record of one worker exit.
        """
        self.close()
        self._reset()
        debug_dir = attempt_dir / "debug"
        self._group, self._round, self._dir, self._failure_of = group, round_, debug_dir, failure_of
        for rank in group.pids:
            self._workers[rank] = _Worker(debug_dir / f"rank_{rank}.flight", progress.get(rank, ()))

    def close(self) -> None:
        """Stop watching (the attempt is over); the last attempt's :meth:`explain` still answers."""
        for w in self._workers.values():
            w.flight.close()
        self._group = None

    # -- the check -------------------------------------------------------------------------------
    def check(self) -> None:
        """One look at the workers (once per monitor interval); acts when they hang or ask."""
        group = self._group
        if group is None:
            return
        now = self._clock()
        self._scan_requests()
        if self.timeout > 0 and self._claim is None:
            if self._progressed(group):
                self._since = now
            elif self._since is not None and now - self._since >= self.timeout:
                self._no_progress(group)
        if self._waiting:
            self._answer(now)

    def _progressed(self, group: WorkerGroup) -> bool:
        running = group.running()
        moved = False
        for rank in running:
            w = self._workers.get(rank)
            if w is not None and w.moved():
                moved = True
        return moved

    def _no_progress(self, group: WorkerGroup) -> None:
        seen = time.time()
        quiet = format_duration(self.timeout)
        why = f"no progress for {quiet} on {self.host} "
        why += "([debug] hang_timeout: no collective completed, no timeline event)"
        if not self._claim_round(why):
            return
        self._say(why + "; gathering every worker's stacks (debug stacks), then failing the attempt")
        self._gather(why)
        running = group.running()
        pids = group.pids
        for rank in running:
            self._killed[pids[rank]] = seen
        if self._failure_of is not None:
            for rank in running:  # before the kill: its peers' failures come after it
                doomed = WorkerExit(rank, pids[rank], -int(signal.SIGKILL), float("nan"), seen)
                with contextlib.suppress(Exception):  # the backend may be away: the monitor's record still comes
                    self._publish(self._failure_of(doomed))
        group.forward_signal(signal.SIGKILL)

    # -- the claim and the report ----------------------------------------------------------------
    def _claim_round(self, why: str) -> bool:
        """Claim this round's hang report; ``False`` when another node has it (said so)."""
        self._claimed_at = self._clock()
        key = debug_hang_claim_key(self._round)
        try:
            won, entry = self._backend.compare_and_set(key, {"node": self.node_id, "why": why}, version=None)
        except Exception:  # noqa: BLE001 - the backend is away: this node reports what it can see
            won, entry = True, None
        self._claim = "mine" if won else "theirs"
        if not won:
            value = entry.value if entry is not None and isinstance(entry.value, dict) else {}
            self._say(f"{why}; node {value.get('node')!r} saw the hang first and gathers the report")
        return won

    def _gather(self, why: str) -> None:
        self.diagnosis = self._debug.report_hang(why, self._say)
        value = {"node": self.node_id, "why": why, "diagnosis": self.diagnosis}
        with contextlib.suppress(Exception):  # the others answer their workers without it
            self._backend.set(debug_hang_claim_key(self._round), value)

    def _claimer_diagnosis(self, now: float) -> str | None:
        """The diagnosis the claiming node published (read at most twice a second); ``""`` after the wait."""
        if now >= self._next_look:
            self._next_look = now + 0.5
            with contextlib.suppress(Exception):
                entry = self._backend.get(debug_hang_claim_key(self._round))
                value = entry.value if entry is not None and isinstance(entry.value, dict) else {}
                if value.get("diagnosis"):
                    self.diagnosis = str(value["diagnosis"])
                    return self.diagnosis
        return "" if now - self._claimed_at > ANSWER_WAIT else None

    # -- workers' requests (CollectiveTimeout) ---------------------------------------------------
    def _scan_requests(self) -> None:
        directory = self._dir
        if directory is None:
            return
        try:
            mtime = os.stat(directory).st_mtime_ns
        except OSError:
            return
        if mtime == self._dir_mtime and time.time_ns() - mtime > _RECENT_NS:
            return
        self._dir_mtime = mtime
        found: list[tuple[int, Path]] = []
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for e in entries:
                if e.name.endswith(REQUEST_SUFFIX) and e.name.startswith("rank_") and e.name not in self._handled:
                    self._handled.add(e.name)
                    with contextlib.suppress(ValueError):
                        found.append((int(e.name[len("rank_") : -len(REQUEST_SUFFIX)]), Path(e.path)))
        for rank, path in found:
            self._asked.add(rank)
            self._waiting[rank] = path
        if found and self._claim is None:
            rank, path = found[0]
            why = _request_why(path) or f"rank {rank} raised CollectiveTimeout"
            if self._claim_round(why):
                self._say(f"{why}; gathering every worker's stacks (debug stacks)")
                self._gather(why)

    def _answer(self, now: float) -> None:
        diagnosis = self.diagnosis
        if diagnosis is None:
            diagnosis = self._claimer_diagnosis(now) if self._claim == "theirs" else None
        if diagnosis is None:
            return
        for path in self._waiting.values():
            answer = path.with_name(path.name + ANSWER_SUFFIX)
            tmp = answer.with_name(answer.name + ".tmp")
            with contextlib.suppress(OSError):
                tmp.write_text(json.dumps({"diagnosis": diagnosis}))
                os.replace(tmp, answer)
        self._waiting.clear()

    # -- failures --------------------------------------------------------------------------------
    def explain(self, ex: WorkerExit) -> tuple[str, float] | None:
        """How a worker's failure reads when a hang was seen, and when it failed; ``None``: not a hang."""
        hang = f"; hang {self.diagnosis}" if self.diagnosis else ""
        seen = self._killed.get(ex.pid)
        if seen is not None:
            quiet = format_duration(self.timeout)
            return f"no progress for {quiet} ([debug] hang_timeout), killed ({ex.describe()}){hang}", min(
                ex.exited_at, seen
            )
        if ex.rank in self._asked and hang:
            return f"{ex.describe()} after a collective timed out{hang}", ex.exited_at
        return None


def _request_why(path: Path) -> str | None:
    try:
        value: Any = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return str(value["why"]) if isinstance(value, dict) and value.get("why") else None
