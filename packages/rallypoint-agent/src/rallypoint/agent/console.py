"""The console tee's writer: worker lines reach the agent's stdout/stderr without ever blocking a reader.

A console can stop reading: a slow ssh session, Ctrl-S on a terminal, a full pipe. If the threads
that read the workers' pipes wrote to the console themselves, they would block with it, the
workers' pipes would fill up, and every worker would stall on its next ``print``. So the readers
only *queue* console text here (after the line is in the log file) and return at once:

* one writer thread per console stream (stdout, stderr) takes the queued text and writes it, so a
  stuck stdout does not hold up stderr;
* the queue is bounded (:data:`DEFAULT_CAPACITY` characters per stream). Text that does not fit is
  dropped and counted per rank, and once the writer has caught up it prints
  ``[rallypoint] console fell behind: N lines from rank R not shown (complete in <log file>)``;
* a stream with a file descriptor is written with :func:`os.write` on that descriptor, so a writer
  blocked on a stuck console holds no Python lock (the agent's own messages and its interpreter
  shutdown never wait behind it); other streams (a ``StringIO``) get ``write`` and ``flush``.

At interpreter exit the queued text is written out (:func:`flush`), waiting for the console as a
plain ``print`` would: the drop notices are the last thing a reader of a stuck pipe sees.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import select
import sys
import threading
import time
from typing import TextIO

__all__ = ["DEFAULT_CAPACITY", "ConsoleLane", "flush", "lane"]

#: Characters of console text queued per stream before lines are dropped.
DEFAULT_CAPACITY = 1 << 20
#: Most characters joined into one write.
_BATCH = 1 << 16


class ConsoleLane:
    """A bounded queue of console text and the thread that writes it to one stream.

    Args:
        is_err: the stream items without an explicit target go to: ``sys.stderr`` when true,
            ``sys.stdout`` otherwise (looked up when written, so a redirected ``sys.stdout`` is
            honoured).
        capacity: characters that may wait; text beyond it is dropped and counted.
    """

    def __init__(self, is_err: bool, capacity: int = DEFAULT_CAPACITY) -> None:
        self.is_err = is_err
        self.capacity = capacity
        self._cond = threading.Condition()
        self._items: collections.deque[tuple[TextIO | None, str]] = collections.deque()
        self._queued = 0
        #: (target, rank, where the lines are kept) -> lines dropped since the last notice
        self._dropped: dict[tuple[TextIO | None, int, str], int] = {}
        self._busy = False
        self._thread: threading.Thread | None = None

    def put(self, text: str, *, lines: int, rank: int, where: str, target: TextIO | None = None) -> bool:
        """Queue ``text`` (``lines`` lines of ``rank``) without blocking; returns whether it was queued.

        Text that does not fit is dropped and counted; ``where`` (the rank's log file) is named
        in the notice.
        """
        with self._cond:
            if self._queued and self._queued + len(text) > self.capacity:  # an empty queue takes any chunk
                key = (target, rank, where)
                self._dropped[key] = self._dropped.get(key, 0) + lines
                return False
            self._items.append((target, text))
            self._queued += len(text)
            self._start()
            self._cond.notify_all()
        return True

    def notice(self, text: str, target: TextIO | None = None) -> None:
        """Queue an agent message; never dropped (they are rare and short)."""
        with self._cond:
            self._items.append((target, text))
            self._queued += len(text)
            self._start()
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued (drop notices included) is written; returns whether it was."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._items or self._dropped or self._busy:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                # wake up now and then so that a signal handler in the main thread can run
                self._cond.wait(1.0 if remaining is None else min(remaining, 1.0))
            return True

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            name = f"rallypoint-console-{'err' if self.is_err else 'out'}"
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def _next(self) -> tuple[TextIO | None, str]:
        """Take the next batch (one target), or the drop notices once the queue is empty."""
        with self._cond:
            while not self._items and not self._dropped:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait()
            self._busy = True
            if not self._items:
                dropped, self._dropped = self._dropped, {}
                target = next(iter(dropped))[0]
                self._dropped = {k: n for k, n in dropped.items() if k[0] is not target}
                text = "".join(
                    f"[rallypoint] console fell behind: {n} line{'s' if n != 1 else ''} from rank {rank} "
                    f"not shown (complete in {where})\n"
                    for (t, rank, where), n in dropped.items()
                    if t is target
                )
                return target, text
            target, text = self._items.popleft()
            parts = [text]
            size = len(text)
            while self._items and self._items[0][0] is target and size < _BATCH:
                more = self._items.popleft()[1]
                parts.append(more)
                size += len(more)
            self._queued -= size
            return target, "".join(parts)

    def _run(self) -> None:
        while True:
            target, text = self._next()
            stream = target or (sys.stderr if self.is_err else sys.stdout)
            with contextlib.suppress(OSError, ValueError):  # console gone: the log files have it all
                _write(stream, text)


def _write(stream: TextIO, text: str) -> None:
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        stream.write(text)
        stream.flush()
        return
    data = text.encode(getattr(stream, "encoding", None) or "utf-8", errors="replace")
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:  # someone made the descriptor non-blocking: wait until it drains
            select.select([], [fd], [])
            continue
        view = view[written:]


_lanes = {False: ConsoleLane(False), True: ConsoleLane(True)}


def lane(is_err: bool) -> ConsoleLane:
    """The process-wide lane for worker stderr (``True``) or stdout (``False``)."""
    return _lanes[is_err]


def flush(timeout: float | None = None) -> bool:
    """Write out both lanes, waiting up to ``timeout`` seconds in all; returns whether both drained."""
    deadline = None if timeout is None else time.monotonic() + timeout
    done = True
    for one in _lanes.values():
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        done = one.flush(remaining) and done
    return done


atexit.register(flush)
