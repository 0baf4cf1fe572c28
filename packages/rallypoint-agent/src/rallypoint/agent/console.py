"""The agent's console: what the agent process prints reaches its stdout and stderr without ever holding it up.

A console can stop reading: a slow ssh session, Ctrl-S on a terminal, a pipe into a program that
does not read it, or a reader that went away (``| head -1``). Nothing the agent does waits for it:
not the threads that read the workers' pipes, not its restarts, not its signals, not its exit.

* Every line the agent process prints is *queued* here: the worker lines relayed by
  :mod:`rallypoint.agent.logs` (:meth:`ConsoleLane.put`), the agent's own messages and report
  (:func:`message`), and, under ``rallypoint run``, anything else written to ``sys.stdout`` or
  ``sys.stderr`` (:func:`capture_std_streams`). One writer thread per stream (a *lane*) writes
  it, so a stuck stdout does not hold up stderr.
* The queues are bounded: :data:`DEFAULT_CAPACITY` characters of worker lines per stream, and
  :data:`MESSAGE_RESERVE` more for the agent's messages. A line that does not fit is dropped and
  counted; once the writer has caught up it prints ``[rallypoint] console fell behind: N lines
  from rank R not shown (complete in <log file>)``. The log files are written before anything
  is queued and keep every byte.
* A writer waits with ``poll`` until the stream takes text and writes at most ``PIPE_BUF`` bytes
  at a time, ending on a line where it can: a write does not block on a full pipe, and the lines
  of two lanes sharing one pipe (``2>&1``) never cut into each other.
* A console whose reader went away (``EPIPE``, or a closed stream) is written no more: what is
  queued for it and what comes later is dropped and counted, and the agent carries on; its exit
  status stays the job's.
* At the end (:func:`settle`, which the agent calls before its last words, and again at
  interpreter exit) queued text gets as long as the console keeps taking it (at most
  :data:`SETTLE_LIMIT` seconds), and :data:`STALL` seconds once it takes nothing; the rest is
  dropped and counted. :func:`not_shown` is the count the agent reports.
* An agent message waits, in its writer and never in the caller, until the worker lines queued
  on the other stream before it are written (or that stream stops moving for
  :data:`ORDER_WAIT` seconds), so on a terminal a report follows the output it explains.
"""

from __future__ import annotations

import atexit
import collections
import io
import os
import select
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

__all__ = [
    "DEFAULT_CAPACITY",
    "MESSAGE_RESERVE",
    "ORDER_WAIT",
    "SETTLE_LIMIT",
    "STALL",
    "ConsoleLane",
    "ConsoleStream",
    "capture_std_streams",
    "flush",
    "lane",
    "message",
    "not_shown",
    "settle",
]

#: Characters of worker lines queued per stream before lines are dropped.
DEFAULT_CAPACITY = 1 << 20
#: Characters the agent's own messages may queue beyond :data:`DEFAULT_CAPACITY`.
MESSAGE_RESERVE = 1 << 16
#: Seconds without a byte taken after which :func:`settle` gives the console up.
STALL = 2.0
#: Seconds :func:`settle` waits at most, even for a console that keeps taking text.
SETTLE_LIMIT = 20.0
#: Seconds an agent message waits for a stuck other stream before it is written anyway.
ORDER_WAIT = 1.0
#: Most characters joined into one item, and bytes in one write.
_BATCH = 1 << 16
_CHUNK = getattr(select, "PIPE_BUF", 4096)
_POLL_MS = 100

#: Guards the state of every lane; callers, writers and :func:`settle` wait on it.
_cond = threading.Condition()


@dataclass
class _Item:
    """Queued text for one stream: ``lines`` newline-ended lines (``after``: see :meth:`ConsoleLane.notice`)."""

    stream: TextIO
    text: str
    lines: int
    after: int = -1


def _resolve(target: TextIO | None, is_err: bool) -> TextIO | None:
    """The real stream for ``target`` (``None``: the process's stdout or stderr, as it is now)."""
    stream = target if target is not None else (sys.stderr if is_err else sys.stdout)
    return stream.underlying if isinstance(stream, ConsoleStream) else stream


class ConsoleLane:
    """A bounded queue of console text and the thread that writes it, for one of the agent's streams.

    Args:
        is_err: items without a target go to ``sys.stderr`` when true, ``sys.stdout`` otherwise
            (as they are when queued, so a redirected ``sys.stdout`` is honoured).
        capacity: characters of worker lines that may wait; lines beyond it are dropped and counted.
    """

    def __init__(self, is_err: bool, capacity: int = DEFAULT_CAPACITY) -> None:
        self.is_err = is_err
        self.capacity = capacity
        #: The other stream's lane, whose earlier lines an agent message waits for.
        self.other: ConsoleLane | None = None
        #: Lines never shown: dropped, given up by :func:`settle`, or refused by a closed console.
        self.not_shown = 0
        #: When the writer last wrote a byte (``time.monotonic()``).
        self.progress = time.monotonic()
        self.enqueued = 0  # items ever queued
        self.finished = 0  # items written or dropped
        self._items: collections.deque[_Item] = collections.deque()
        self._queued = 0
        #: (stream, rank, where its lines are kept) -> lines dropped since the last notice
        self._dropped: dict[tuple[TextIO, int, str], int] = {}
        self._gone: set[int] = set()  # ids of streams whose reader went away
        self._busy = False
        self._left = 0  # lines of the text being written that are not written yet
        self._interrupt = False
        self._given_up_at: float | None = None
        self._thread: threading.Thread | None = None

    # -- queueing (never blocks) ---------------------------------------------------------------

    def put(self, text: str, *, lines: int, rank: int, where: str, target: TextIO | None = None) -> bool:
        """Queue ``text`` (``lines`` worker lines of ``rank``); returns whether it was queued.

        Text that does not fit is dropped and counted; ``where`` (the rank's log file) is named in
        the notice that says so.
        """
        stream = _resolve(target, self.is_err)
        with _cond:
            if stream is None or id(stream) in self._gone:
                self.not_shown += lines
                return False
            if self._queued and self._queued + len(text) > self.capacity:  # an empty queue takes any chunk
                key = (stream, rank, where)
                self._dropped[key] = self._dropped.get(key, 0) + lines
                self.not_shown += lines
                return False
            self._append(_Item(stream, text, lines))
        return True

    def notice(self, text: str, target: TextIO | None = None) -> bool:
        """Queue an agent message; returns whether it was queued.

        Messages may use :data:`MESSAGE_RESERVE` more than the capacity; beyond that they are
        dropped and counted too. A message is written after the lines already queued on the other
        lane (see :data:`ORDER_WAIT`).
        """
        stream = _resolve(target, self.is_err)
        lines = text.count("\n")
        with _cond:
            if stream is None or id(stream) in self._gone or self._queued + len(text) > self.capacity + MESSAGE_RESERVE:
                self.not_shown += lines
                return False
            other = self.other
            after = other.enqueued if other is not None and other.finished < other.enqueued else -1
            self._append(_Item(stream, text, lines, after))
        return True

    def _append(self, item: _Item) -> None:
        self._items.append(item)
        self._queued += len(item.text)
        self.enqueued += 1
        if self._thread is None or not self._thread.is_alive():
            name = f"rallypoint-console-{'err' if self.is_err else 'out'}"
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()
        _cond.notify_all()

    # -- state ---------------------------------------------------------------------------------

    def pending(self) -> bool:
        """Whether text is queued or being written (drop notices included)."""
        with _cond:
            return bool(self._items or self._busy or self._dropped)

    def give_up(self) -> None:
        """Drop what is queued and what is being written (counted), now; the console is stuck."""
        with _cond:
            for item in self._items:
                self.not_shown += item.lines
            self.finished += len(self._items)
            self._items.clear()
            self._queued = 0
            self._dropped.clear()
            if self._busy:
                self.not_shown += self._left
                self._left = 0
                self._interrupt = True
            self._given_up_at = time.monotonic()
            _cond.notify_all()

    def stuck_since_given_up(self) -> bool:
        """Whether :meth:`give_up` was called and the console has taken nothing since."""
        with _cond:
            return self._given_up_at is not None and self.progress <= self._given_up_at

    def reset(self) -> None:
        """Forget what is queued (in a child process after ``fork``, where the writer thread is not)."""
        self._items, self._queued, self._dropped = collections.deque(), 0, {}
        self._busy, self._left, self._interrupt, self._thread = False, 0, False, None

    # -- the writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item, count = self._take()
            if item.after >= 0 and self.other is not None:
                self._wait_for(self.other, item.after)
            try:
                self._write(item)
            except Exception:  # noqa: BLE001 - the reader went away (EPIPE), or the stream was closed
                with _cond:
                    self._gone.add(id(item.stream))
            with _cond:
                self.not_shown += self._left
                self._left = 0
                self.finished += count
                _cond.notify_all()

    def _take(self) -> tuple[_Item, int]:
        """The next text to write (consecutive items for one stream joined) and how many items it holds."""
        with _cond:
            while True:
                while self._items and id(self._items[0].stream) in self._gone:
                    gone = self._items.popleft()
                    self._queued -= len(gone.text)
                    self.not_shown += gone.lines
                    self.finished += 1
                self._dropped = {k: n for k, n in self._dropped.items() if id(k[0]) not in self._gone}
                if self._items or self._dropped:
                    break
                if self._busy:  # say so once (pending() waiters): the other lane's writer waits on _cond too,
                    self._busy = False  # and waking it on every turn made the two wake each other for good
                    _cond.notify_all()
                _cond.wait()
            self._busy, self._interrupt = True, False
            if not self._items:
                return self._drop_notice(), 0
            first = self._items.popleft()
            parts, lines, count, size = [first.text], first.lines, 1, len(first.text)
            while self._items and self._items[0].stream is first.stream and self._items[0].after < 0 and size < _BATCH:
                more = self._items.popleft()
                parts.append(more.text)
                lines, count, size = lines + more.lines, count + 1, size + len(more.text)
            self._queued -= size
            self._left = lines
            return _Item(first.stream, "".join(parts), lines, first.after), count

    def _drop_notice(self) -> _Item:
        """Say which lines were dropped (for one stream), once the queue is empty."""
        stream = next(iter(self._dropped))[0]
        text = "".join(
            f"[rallypoint] console fell behind: {n} line{'s' if n != 1 else ''} from rank {rank} "
            f"not shown (complete in {where})\n"
            for (s, rank, where), n in self._dropped.items()
            if s is stream
        )
        self._dropped = {k: n for k, n in self._dropped.items() if k[0] is not stream}
        return _Item(stream, text, 0)

    @staticmethod
    def _wait_for(other: ConsoleLane, after: int) -> None:
        """Wait until ``other`` has finished its first ``after`` items, or has not moved for :data:`ORDER_WAIT`."""
        started = time.monotonic()
        with _cond:
            while other.finished < after:
                quiet = time.monotonic() - max(started, other.progress)
                if quiet >= ORDER_WAIT:
                    return
                _cond.wait(min(ORDER_WAIT - quiet, 0.1))

    def _write(self, item: _Item) -> None:
        stream = item.stream
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
            stream.write(item.text)
            stream.flush()
            with _cond:
                self._left, self.progress = 0, time.monotonic()
            return
        self._write_fd(fd, item.text.encode(getattr(stream, "encoding", None) or "utf-8", errors="replace"))

    def _write_fd(self, fd: int, data: bytes) -> None:
        """Write ``data`` to ``fd`` in pieces the stream takes without blocking, until done or given up."""
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        view, done = memoryview(data), 0
        while done < len(data):
            with _cond:
                if self._interrupt:
                    return
            if not poller.poll(_POLL_MS):
                continue
            end = min(len(data), done + _CHUNK)
            if end < len(data):
                newline = data.rfind(b"\n", done, end)
                end = newline + 1 if newline >= done else end
            try:
                written = os.write(fd, view[done:end])
            except BlockingIOError:  # someone made the descriptor non-blocking: poll again
                time.sleep(0.01)
                continue
            with _cond:
                self._left = max(0, self._left - data.count(b"\n", done, done + written))
                self.progress = time.monotonic()
            done += written


class ConsoleStream(io.TextIOBase):
    """A text stream that queues what is written to it on a lane: ``sys.stdout``/``sys.stderr`` of ``rallypoint run``.

    Args:
        lane: the lane that writes it.
        underlying: the real stream (its encoding, terminal and descriptor are this stream's).
    """

    def __init__(self, lane: ConsoleLane, underlying: TextIO) -> None:
        super().__init__()
        self.lane = lane
        self.underlying = underlying

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The real stream's encoding."""
        return getattr(self.underlying, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        """Characters the encoding cannot hold are replaced."""
        return "replace"

    def write(self, s: str) -> int:
        """Queue ``s`` (never blocks; dropped and counted when the console does not keep up)."""
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        if s:
            self.lane.notice(s, self.underlying)
        return len(s)

    def flush(self) -> None:
        """Nothing to do: the lane's writer writes as soon as the console takes text."""

    def writable(self) -> bool:
        """Always: text is queued."""
        return True

    def isatty(self) -> bool:
        """Whether the real stream is a terminal."""
        try:
            return bool(self.underlying.isatty())
        except (ValueError, AttributeError):
            return False

    def fileno(self) -> int:
        """The real stream's descriptor (for child processes that inherit it)."""
        return self.underlying.fileno()


_lanes = {False: ConsoleLane(False), True: ConsoleLane(True)}
_lanes[False].other, _lanes[True].other = _lanes[True], _lanes[False]


def lane(is_err: bool) -> ConsoleLane:
    """The process-wide lane for stderr (``True``) or stdout (``False``)."""
    return _lanes[is_err]


def message(text: str, target: TextIO | None = None) -> bool:
    """Queue an agent message (whole lines) for ``target``, ``sys.stderr`` by default; never blocks."""
    return _lanes[True].notice(text, target)


def capture_std_streams() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` of this process queue on the lanes, for the rest of its life.

    ``rallypoint run`` does this before its agent starts, so that nothing printed in the process
    (a plugin's ``print``, a warning, the command line's last error) can block it.
    """
    for name, is_err in (("stdout", False), ("stderr", True)):
        current = getattr(sys, name)
        if current is not None and not isinstance(current, ConsoleStream):
            setattr(sys, name, ConsoleStream(_lanes[is_err], current))


def not_shown() -> int:
    """Lines this process queued for its console that were not shown (both streams)."""
    with _cond:
        return sum(one.not_shown for one in _lanes.values())


def flush(timeout: float | None = None) -> bool:
    """Wait up to ``timeout`` seconds until both lanes wrote everything queued; returns whether they did."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _cond:
        while any(one.pending() for one in _lanes.values()):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            _cond.wait(0.1 if remaining is None else min(remaining, 0.1))  # a signal handler may run meanwhile
        return True


def settle(stall: float = STALL, limit: float = SETTLE_LIMIT) -> int:
    """Let the console write what is queued now, while it takes text; returns :func:`not_shown`.

    A stream that takes nothing for ``stall`` seconds, or was given up before and is still
    stuck, is given up (what it has queued is dropped and counted). Text queued meanwhile (a
    process that left the job still writing to a worker's pipe) is not waited for, nor is any
    stream longer than ``limit`` seconds in all.
    """
    started = time.monotonic()
    with _cond:
        waiting = {one: one.enqueued for one in _lanes.values() if one.pending()}
    while waiting:
        for one, queued in list(waiting.items()):
            with _cond:
                done = one.finished >= queued and not one._dropped
                idle = time.monotonic() - max(started, one.progress)
            if done:
                del waiting[one]
            elif idle >= stall or one.stuck_since_given_up() or time.monotonic() - started >= limit:
                one.give_up()
                del waiting[one]
        if waiting:
            with _cond:
                _cond.wait(0.05)
    return not_shown()


def _after_fork_in_child() -> None:
    global _cond
    _cond = threading.Condition()  # a writer of the parent may have held it
    for one in _lanes.values():
        one.reset()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(settle)
