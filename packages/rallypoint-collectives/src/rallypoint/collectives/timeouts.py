"""Deciding what a timed-out call does, and one time budget shared by several calls.

* :func:`set_timeout_handler` installs a process-wide handler; every facade call also takes
  ``on_timeout=`` for itself. When a call's timeout expires the handler receives a
  :class:`TimeoutEvent` (the operation, the group, the ranks that did not arrive, the seconds
  waited, the seconds allowed, the shared :class:`Deadline` if any) and answers with
  :class:`RaiseTimeout` (the default, also what ``None`` means), :class:`WaitMore` (wait once
  more, for that many seconds) or :class:`ExitProcess` (end the process with a code).
* :class:`Deadline` is a budget in seconds that several calls share: pass it as ``timeout=``
  and each call waits at most what is left of it.

Importing this module does not import torch.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from rallypoint.core.wait_more import WaitMore

if TYPE_CHECKING:
    from rallypoint.collectives.errors import CollectiveTimeout

__all__ = [
    "Deadline",
    "DeadlineWait",
    "ExitProcess",
    "RaiseTimeout",
    "TimeoutDecision",
    "TimeoutEvent",
    "TimeoutHandler",
    "WaitMore",
    "get_timeout_handler",
    "set_timeout_handler",
]

log = logging.getLogger("rallypoint.collectives")

#: The shortest wait a call is given: torch reads a zero timeout as "no timeout".
MIN_WAIT = 0.001


@dataclass(frozen=True)
class DeadlineWait:
    """One call that waited under a :class:`Deadline`.

    Attributes:
        what: the call, e.g. ``"recv from rank 2"``.
        seconds: how much of the budget it used.
        timed_out: whether it ran out of budget.
    """

    what: str
    seconds: float
    timed_out: bool = False


class Deadline:
    """A time budget, in seconds, shared by every call given it as ``timeout=``.

    The clock starts at :meth:`close` or, if that was never called, at the first call that
    waits under it. Each call waits at most :meth:`remaining`; the calls' usage is kept in
    :attr:`waits`, and a :class:`~rallypoint.collectives.CollectiveTimeout` raised under the
    deadline lists it. Thread-safe enough for one rank's calls; not shared between processes.

    Example::

        deadline = rc.Deadline(10)
        deadline.close()                      # start counting now
        for src in range(1, world):
            rc.recv(buf[src], src, timeout=deadline)
        print(deadline.is_timed_out(), deadline.remaining())

    Attributes:
        timeout: the budget in seconds.
        waits: one :class:`DeadlineWait` per call that waited under it, in order.
    """

    __slots__ = ("_lock", "_started", "timeout", "waits")

    def __init__(self, seconds: float) -> None:
        value = float(seconds)
        if math.isnan(value) or value < 0 or math.isinf(value):
            raise ValueError(f"Deadline(seconds): expected a finite number of seconds >= 0, got {seconds!r}")
        self.timeout = value
        self.waits: list[DeadlineWait] = []
        self._started: float | None = None
        self._lock = threading.Lock()

    def close(self) -> Deadline:
        """Start counting now (a no-op if already started); returns the deadline itself."""
        with self._lock:
            if self._started is None:
                self._started = time.monotonic()
        return self

    @property
    def closed(self) -> bool:
        """Whether the clock has started."""
        return self._started is not None

    def elapsed(self) -> float:
        """Seconds since the clock started (0 before)."""
        started = self._started
        return 0.0 if started is None else time.monotonic() - started

    def remaining(self) -> float:
        """Seconds left (never negative); the whole budget before the clock starts."""
        return max(0.0, self.timeout - self.elapsed())

    def is_timed_out(self) -> bool:
        """Whether the clock has started and the budget is spent."""
        return self._started is not None and self.elapsed() >= self.timeout

    def record(self, what: str, seconds: float, timed_out: bool = False) -> None:
        """Note that ``what`` used ``seconds`` of the budget (the facade calls this)."""
        self.waits.append(DeadlineWait(what, seconds, timed_out))

    def describe(self) -> str:
        """How the budget was used, for errors: ``"deadline of 10s: recv from rank 1 0.01s, ..."``."""
        used = ", ".join(f"{w.what} {w.seconds:.3g}s" + (" (ran out)" if w.timed_out else "") for w in self.waits)
        return f"deadline of {self.timeout:g}s shared by {len(self.waits)} wait(s): {used or 'none'}"

    def __repr__(self) -> str:
        state = f"remaining={self.remaining():.3g}" if self.closed else "not started"
        return f"Deadline({self.timeout:g}, {state})"


@dataclass(frozen=True)
class TimeoutEvent:
    """What a timeout handler is told.

    Attributes:
        op: the operation, e.g. ``"barrier"``.
        group: ``"WORLD"`` or ``"group <name>"``.
        group_ranks: the group's global ranks.
        missing: global ranks that did not arrive (empty when unknown: see ``error.detail``).
        arrived: global ranks known to have reached the same call.
        rank: this worker's global rank.
        elapsed: seconds the call has waited so far.
        timeout: seconds the call was allowed (before any extension).
        deadline: the :class:`Deadline` the call ran under, or ``None``.
        attempt: 1 at the first expiry, 2 after a :class:`WaitMore` expired too.
        can_wait_more: whether :class:`WaitMore` is honoured now (only once per call, and not on
            Gloo point-to-point calls: Gloo closes the connection to the peer when their wait
            expires).
        error: the :class:`~rallypoint.collectives.CollectiveTimeout` that :class:`RaiseTimeout`
            raises.
    """

    op: str
    group: str
    group_ranks: tuple[int, ...]
    missing: tuple[int, ...]
    arrived: tuple[int, ...]
    rank: int
    elapsed: float
    timeout: float
    deadline: Deadline | None
    attempt: int
    can_wait_more: bool
    error: CollectiveTimeout


@dataclass(frozen=True)
class RaiseTimeout:
    """Raise the :class:`~rallypoint.collectives.CollectiveTimeout` (the default)."""


@dataclass(frozen=True)
class ExitProcess:
    """End the process with exit status ``code`` (the error is written to stderr first).

    Attributes:
        code: the exit status (default 1).
    """

    code: int = 1


TimeoutDecision: TypeAlias = RaiseTimeout | WaitMore | ExitProcess
TimeoutHandler: TypeAlias = Callable[[TimeoutEvent], "TimeoutDecision | None"]

_HANDLER: TimeoutHandler | None = None


def set_timeout_handler(handler: TimeoutHandler | None) -> TimeoutHandler | None:
    """Install ``handler`` for every call of this process that has no ``on_timeout=``.

    ``None`` restores the default (raise). Returns the previous handler.
    """
    global _HANDLER
    if handler is not None and not callable(handler):
        raise TypeError(f"set_timeout_handler: expected a callable or None, got {handler!r}")
    previous, _HANDLER = _HANDLER, handler
    return previous


def get_timeout_handler() -> TimeoutHandler | None:
    """The process-wide handler, or ``None``."""
    return _HANDLER


def decide(event: TimeoutEvent, on_timeout: TimeoutHandler | None) -> float | None:
    """Ask the call's handler (else the process-wide one) what to do about ``event``.

    Returns:
        the seconds to wait more, or ``None``: raise ``event.error``.

    Raises:
        SystemExit: the handler answered :class:`ExitProcess` (or called ``sys.exit``).
        TypeError: the handler answered something that is not a decision.
    """
    handler = on_timeout if on_timeout is not None else _HANDLER
    if handler is None:
        return None
    answer = handler(event)
    if answer is None or isinstance(answer, RaiseTimeout):
        return None
    if isinstance(answer, WaitMore):
        if event.can_wait_more:
            log.warning(
                "collectives: %s on %s not complete after %.1fs on rank %d (missing: %s); the timeout handler "
                "waits %gs more",
                event.op,
                event.group,
                event.elapsed,
                event.rank,
                ", ".join(map(str, event.missing)) or "unknown",
                answer.seconds,
            )
            return float(answer.seconds)
        why = "a call waits more only once" if event.attempt > 1 else "Gloo closed the connection to the peer"
        log.warning("collectives: the timeout handler asked to wait more, refused (%s): raising", why)
        return None
    if isinstance(answer, ExitProcess):
        print(f"rallypoint: {event.error} The timeout handler ends the process (exit {answer.code}).", file=sys.stderr)
        raise SystemExit(answer.code) from event.error
    raise TypeError(
        f"timeout handler {getattr(handler, '__qualname__', handler)!r} returned {answer!r}: "
        "expected RaiseTimeout(), WaitMore(seconds), ExitProcess(code) or None"
    )
