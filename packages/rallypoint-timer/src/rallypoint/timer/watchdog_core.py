"""The watchdog's core, shared by every transport: the timer table and its expiry, and the contract.

:class:`WatchdogServer` runs in the agent. When a timer's deadline passes before it is released,
the server calls its expiry handler with an :class:`Expiry` (pid, rank, scope, deadline); the agent
kills the worker's process group and reports the failure. Without a handler the server SIGKILLs the
pid. Transports (``local``, ``file``: :mod:`rallypoint.timer.backends`) only move requests; the
worker-side API (:func:`rallypoint.timer.watchdog.expires`) is in :mod:`rallypoint.timer.watchdog`.

Requests are JSON objects compatible with torch's file-based timer protocol:
``{"version": 1, "pid": <int>, "scope_id": <str>, "expiration_time": <epoch s>, "signal": <int>}``,
with a negative ``expiration_time`` meaning release. rallypoint clients add ``"rank"`` and
``"acquired_at"``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "ENV_BACKEND",
    "ENV_RANK",
    "Expiry",
    "ExpiryHandler",
    "TimerClient",
    "WatchdogError",
    "WatchdogServer",
    "WatchdogUnavailableError",
]

log = logging.getLogger("rallypoint.timer.watchdog")  # one logger name for the whole watchdog

#: Worker env: the backend name (``local`` or ``file``) the client should use.
ENV_BACKEND = "RALLYPOINT_WATCHDOG_BACKEND"
#: Worker env: the rank the client reports (falls back to ``RANK``).
ENV_RANK = "RALLYPOINT_WATCHDOG_RANK"

#: Requests larger than this are refused: a FIFO write is atomic only up to ``PIPE_BUF``.
MAX_REQUEST_BYTES = 4096


class WatchdogError(RuntimeError):
    """A watchdog timer could not be used (bad arguments, no server configured)."""


class WatchdogUnavailableError(WatchdogError, BrokenPipeError):
    """The watchdog server is not reachable (not started, or gone)."""


@dataclass(frozen=True)
class Expiry:
    """A timer that expired before it was released.

    Attributes:
        pid: the worker process that acquired it.
        rank: the worker's global rank (``-1`` when unknown, e.g. a torch client without ``RANK``).
        scope: the timer's scope name.
        deadline: when it expired, seconds since the epoch.
        acquired_at: when it was acquired, seconds since the epoch (``nan`` when unknown).
        signal: the signal the client asked for (``SIGKILL`` by default).
    """

    pid: int
    rank: int
    scope: str
    deadline: float
    acquired_at: float
    signal: int = int(signal.SIGKILL)

    def describe(self) -> str:
        """One line for failure reports."""
        import datetime

        stamp = datetime.datetime.fromtimestamp(self.deadline).isoformat(sep=" ", timespec="milliseconds")
        held = ""
        if self.acquired_at == self.acquired_at:  # not nan
            held = f" ({self.deadline - self.acquired_at:.3f}s after it was acquired)"
        return f"rank {self.rank} (pid {self.pid}): watchdog timer {self.scope!r} expired at {stamp}{held}"

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``failure.json``."""
        return {
            "pid": self.pid,
            "rank": self.rank,
            "scope": self.scope,
            "deadline": self.deadline,
            "acquired_at": self.acquired_at,
            "signal": self.signal,
        }


#: Called from a server thread with each expiry; it must not block for long.
ExpiryHandler = Callable[[Expiry], None]


@dataclass
class _Timer:
    deadline: float
    acquired_at: float
    rank: int
    signal: int


class WatchdogServer:
    """The agent-side watchdog: a table of timers keyed by ``(pid, scope)`` and a watchdog thread.

    Transports feed it with :meth:`submit` (a decoded request) from their own threads. The
    watchdog thread sleeps until the earliest deadline (or until a request changes the table),
    so an expiry is noticed within milliseconds without polling. Timers of processes that no
    longer exist are dropped every ``gc_interval`` seconds.

    Subclasses implement :meth:`worker_env` and the transport; :meth:`stop` stops both.
    """

    def __init__(self, *, gc_interval: float = 1.0, clock: Callable[[], float] = time.time) -> None:
        self._timers: dict[tuple[int, str], _Timer] = {}
        self._ranks: dict[int, int] = {}
        self._cond = threading.Condition()
        self._stopped = False
        self._handler: ExpiryHandler | None = None
        self._clock = clock
        self._gc_interval = gc_interval
        self.expired: list[Expiry] = []
        self._thread = threading.Thread(target=self._watch, name="rallypoint-watchdog", daemon=True)
        self._thread.start()

    # -- the agent's API ----------------------------------------------------------------------

    def worker_env(self, rank: int, pid_hint: int | None = None) -> dict[str, str]:
        """Variables to add to worker ``rank``'s environment so that its client finds this server.

        ``pid_hint`` (the worker's pid, when known) lets the server name the rank of clients that
        do not send one (torch's ``FileTimerClient``).
        """
        if pid_hint is not None:
            self.register_worker(pid_hint, rank)
        return {ENV_RANK: str(rank)}

    def register_worker(self, pid: int, rank: int) -> None:
        """Remember that ``pid`` is worker ``rank`` (for clients that do not send their rank)."""
        with self._cond:
            self._ranks[pid] = rank

    def set_expiry_handler(self, callback: ExpiryHandler | None) -> None:
        """Call ``callback(expiry)`` (from the watchdog thread) instead of killing the worker."""
        with self._cond:
            self._handler = callback

    def stop(self) -> None:
        """Stop the watchdog thread and the transport; pending timers are forgotten."""
        with self._cond:
            if self._stopped:
                return
            self._stopped = True
            self._cond.notify_all()
        self._close_transport()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    @property
    def running(self) -> bool:
        """Whether the server accepts requests."""
        return not self._stopped

    def active_timers(self) -> dict[tuple[int, str], float]:
        """``{(pid, scope): deadline}`` of the timers currently held."""
        with self._cond:
            return {key: t.deadline for key, t in self._timers.items()}

    def __enter__(self) -> WatchdogServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- transports -----------------------------------------------------------------------------

    def _close_transport(self) -> None:
        """Release the transport's resources (subclasses)."""

    def submit_line(self, line: bytes | str) -> None:
        """Decode one JSON request and :meth:`submit` it; malformed input is logged and dropped."""
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
            self.submit(request)
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("watchdog: dropped a malformed request %.200r: %s", line, exc)

    def submit(self, request: Mapping[str, Any]) -> None:
        """Apply one request: acquire (``expiration_time >= 0``) or release (negative)."""
        pid = int(request["pid"])
        scope = str(request["scope_id"])
        expiration = float(request["expiration_time"])
        with self._cond:
            if self._stopped:
                return
            if expiration < 0:
                self._timers.pop((pid, scope), None)
                return
            rank = request.get("rank")
            self._timers[(pid, scope)] = _Timer(
                deadline=expiration,
                acquired_at=float(request.get("acquired_at", float("nan"))),
                rank=int(rank) if rank is not None else self._ranks.get(pid, -1),
                signal=int(request.get("signal", signal.SIGKILL)),
            )
            self._cond.notify()

    # -- the watchdog thread --------------------------------------------------------------------

    def _watch(self) -> None:
        next_gc = time.monotonic() + self._gc_interval
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = self._clock()
                due = [(k, t) for k, t in self._timers.items() if t.deadline <= now]
                if not due:
                    earliest = min((t.deadline for t in self._timers.values()), default=now + self._gc_interval)
                    self._cond.wait(timeout=max(0.0, min(earliest - now, next_gc - time.monotonic())))
                    if self._stopped:
                        return
                    expiries: list[Expiry] = []
                else:
                    expiries = self._collect(due)
                handler = self._handler
            for expiry in expiries:
                self._fire(expiry, handler)
            if time.monotonic() >= next_gc:
                self._gc()
                next_gc = time.monotonic() + self._gc_interval

    def _collect(self, due: list[tuple[tuple[int, str], _Timer]]) -> list[Expiry]:
        """Pick one expiry per pid (its earliest killable timer) and drop all of its timers."""
        per_pid: dict[int, tuple[str, _Timer]] = {}
        for (pid, scope), t in sorted(due, key=lambda item: item[1].deadline):
            if t.signal > 0 and pid not in per_pid:
                per_pid[pid] = (scope, t)
        for key, t in due:
            if t.signal <= 0:  # "never kill": forget it
                self._timers.pop(key, None)
        expiries = []
        for pid, (scope, t) in per_pid.items():
            for key in [k for k in self._timers if k[0] == pid]:
                del self._timers[key]
            rank = t.rank if t.rank >= 0 else self._ranks.get(pid, -1)
            expiries.append(Expiry(pid, rank, scope, t.deadline, t.acquired_at, t.signal))
        return expiries

    def _fire(self, expiry: Expiry, handler: ExpiryHandler | None) -> None:
        self.expired.append(expiry)
        log.warning("watchdog: %s", expiry.describe())
        if handler is not None:
            try:
                handler(expiry)
            except Exception:  # a broken handler must not stop the watchdog
                log.exception("watchdog: the expiry handler failed for %s", expiry.describe())
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(expiry.pid, expiry.signal)

    def _gc(self) -> None:
        with self._cond:
            pids = {pid for pid, _ in self._timers}
        gone = set()
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                gone.add(pid)
            except PermissionError:
                pass
        if gone:
            with self._cond:
                for key in [k for k in self._timers if k[0] in gone]:
                    del self._timers[key]


class TimerClient(Protocol):
    """What :func:`expires` needs from a client (torch's ``TimerClient`` has the same shape)."""

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm ``scope_id`` to expire at ``expiration_time`` (epoch seconds)."""

    def release(self, scope_id: str) -> None:
        """Disarm ``scope_id``."""
