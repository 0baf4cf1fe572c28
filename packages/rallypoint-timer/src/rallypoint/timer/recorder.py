"""A worker's event recorder: spans kept per thread and written to its JSON-lines log.

Recording is cheap (a clock read and a list append at each end; see ``tools/bench/timer.py``):
the log is written by a background thread every ``flush_interval`` seconds, so a worker that
crashes loses at most the last interval. Without a path the records stay in memory.

Log lines (one JSON object each, ``t`` is the kind): ``meta`` (first line of each writer: rank,
pid, host, clock), ``B`` / ``E`` (start / end: ``name``, ``ts`` in ns, ``tid``, depth ``d``,
``args``), ``clock`` (an offset estimate against rank 0, see :mod:`rallypoint.timer.clock`),
``cuda`` (GPU time of a span). :mod:`rallypoint.timer.merge` reads them back.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rallypoint.timer.timeline_config import TimelineConfig, TimelineError

__all__ = ["LOG_VERSION", "Callback", "ClockRecord", "Event", "Recorder"]

LOG_VERSION = 1


class ClockRecord(Protocol):
    """A clock-offset estimate as the log takes it (:class:`rallypoint.timer.clock.ClockEstimate`)."""

    def as_dict(self) -> dict[str, Any]:
        """The fields of the log's ``clock`` line."""
        ...


@dataclass(frozen=True)
class Event:
    """A span as seen by callbacks.

    Attributes:
        name: the event name.
        rank: the worker's rank.
        start_ns: start, ns on this worker's clock (``time.time_ns`` unless injected).
        end_ns: end; ``None`` in start callbacks.
        tid: the thread that recorded it.
        depth: nesting depth on that thread (0 for outermost).
        args: the keyword arguments given at start.
    """

    name: str
    rank: int
    start_ns: int
    end_ns: int | None
    tid: int
    depth: int
    args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        """Seconds between start and end (``None`` while open)."""
        return None if self.end_ns is None else (self.end_ns - self.start_ns) / 1e9


Callback = Callable[[Event], None]


class Recorder:
    """One worker's event recorder and log writer.

    Args:
        path: the log file (appended to); ``None`` keeps records in memory (:meth:`records`).
        config: what to record; default records everything, flushed every second.
        rank: written in the log header; default ``RANK`` from the environment, else 0.
        clock: nanosecond clock (tests inject skewed ones); default :func:`time.time_ns`.
        autoflush: run the background flusher thread.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        config: TimelineConfig | None = None,
        rank: int | None = None,
        clock: Callable[[], int] = time.time_ns,
        autoflush: bool = True,
    ) -> None:
        self.config = config or TimelineConfig()
        self.rank = int(os.environ.get("RANK", "0") or 0) if rank is None else rank
        self.path = Path(path) if path is not None else None
        self.clock = clock
        self._buf: list[tuple[Any, ...]] = []
        self._memory: list[tuple[Any, ...]] = []
        self._stacks: dict[int, list[tuple[str, int, Any, Any]]] = {}
        self._wanted: dict[str, bool] = {}
        self._names: dict[str, bytes] = {}
        self._start_cbs: list[Callback] = []
        self._end_cbs: list[Callback] = []
        self._flush_lock = threading.Lock()
        self._fd: int | None = None
        self._closed = False
        self._cuda: Any = None
        self._cuda_pending: list[tuple[str, int, int, Any, Any]] = []
        if self.config.cuda:
            self._cuda = _cuda_module()
        if self.path is not None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, like the agent's log dir
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            header = {
                "t": "meta",
                "version": LOG_VERSION,
                "rank": self.rank,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "clock": "time_ns",
                "ts": self.clock(),
                "attempt": _int_env("TORCHELASTIC_RESTART_COUNT"),
                "world_size": _int_env("WORLD_SIZE"),
            }
            os.write(self._fd, json.dumps(header, separators=(",", ":")).encode() + b"\n")
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if autoflush and self.path is not None:
            self._flusher = threading.Thread(target=self._flush_loop, name="rallypoint-timeline", daemon=True)
            self._flusher.start()

    # -- recording (hot path) -------------------------------------------------------------------

    def start(self, name: str, args: Mapping[str, Any] | None = None) -> None:
        """Open event ``name`` on this thread."""
        wanted = self._wanted.get(name)
        if wanted is None:
            wanted = self._wanted[name] = self.config.wants(name)
        if not wanted:
            return
        tid = threading.get_ident()
        stack = self._stacks.get(tid)
        if stack is None:
            stack = self._stacks[tid] = []
        gpu = None
        if self._cuda is not None and self._cuda.is_initialized():
            gpu = self._cuda.Event(enable_timing=True)
            gpu.record()
        ts = self.clock()
        stack.append((name, ts, args, gpu))
        self._buf.append(("B", name, ts, tid, len(stack) - 1, args))
        if self._start_cbs:
            ev = Event(name, self.rank, ts, None, tid, len(stack) - 1, args or {})
            for cb in self._start_cbs:
                cb(ev)

    def end(self, name: str) -> None:
        """Close the innermost open event ``name`` of this thread.

        Raises:
            TimelineError: no event of that name is open on this thread.
        """
        ts = self.clock()
        if not self._wanted.get(name, True):
            return
        tid = threading.get_ident()
        stack = self._stacks.get(tid)
        if stack and stack[-1][0] == name:
            entry = stack.pop()
            depth = len(stack)
        else:
            depth = _find(stack, name)
            if depth < 0:
                if name not in self._wanted and not self.config.wants(name):
                    return
                raise TimelineError(f"end_event({name!r}) without a matching start_event on this thread")
            entry = stack.pop(depth)  # type: ignore[union-attr]
        self._buf.append(("E", name, ts, tid))
        if entry[3] is not None:
            gpu_end = self._cuda.Event(enable_timing=True)
            gpu_end.record()
            self._cuda_pending.append((name, entry[1], tid, entry[3], gpu_end))
        if self._end_cbs:
            ev = Event(name, self.rank, entry[1], ts, tid, depth, entry[2] or {})
            for cb in self._end_cbs:
                cb(ev)

    # -- callbacks ------------------------------------------------------------------------------

    def on_start(self, callback: Callback) -> Callback:
        """Call ``callback(event)`` when an event starts (usable as a decorator)."""
        self._start_cbs.append(callback)
        return callback

    def on_end(self, callback: Callback) -> Callback:
        """Call ``callback(event)`` when an event ends (usable as a decorator)."""
        self._end_cbs.append(callback)
        return callback

    def remove_callback(self, callback: Callback) -> None:
        """Forget ``callback`` (start or end)."""
        for cbs in (self._start_cbs, self._end_cbs):
            while callback in cbs:
                cbs.remove(callback)

    # -- output ---------------------------------------------------------------------------------

    def record_clock(self, estimate: ClockRecord) -> None:
        """Log a clock-offset estimate against the reference rank."""
        self._buf.append(("clock", estimate, self.clock()))

    def flush(self) -> None:
        """Write what was recorded since the last flush (called by the flusher thread)."""
        with self._flush_lock:
            n = len(self._buf)
            chunk = self._buf[:n]
            del self._buf[:n]  # appends from other threads after `n` stay for the next flush
            chunk.extend(self._cuda_ready())
            if not chunk:
                return
            if self._fd is None:
                self._memory.extend(chunk)
                return
            os.write(self._fd, self._encode_all(chunk))

    def _encode_all(self, chunk: list[tuple[Any, ...]]) -> bytes:
        """Encode records as JSON lines; the common ``B``/``E`` lines without ``json.dumps``."""
        names = self._names
        out: list[bytes] = []
        append = out.append
        for item in chunk:
            kind = item[0]
            if kind == "E":
                name = names.get(item[1]) or self._name_json(item[1])
                append(b'{"t":"E","name":%b,"ts":%d,"tid":%d}\n' % (name, item[2], item[3]))
            elif kind == "B" and not item[5]:
                name = names.get(item[1]) or self._name_json(item[1])
                append(b'{"t":"B","name":%b,"ts":%d,"tid":%d,"d":%d}\n' % (name, item[2], item[3], item[4]))
            else:
                append(_encode(item))
        return b"".join(out)

    def _name_json(self, name: str) -> bytes:
        encoded = self._names[name] = json.dumps(name).encode()
        return encoded

    def records(self) -> list[dict[str, Any]]:
        """Every record as a log line would hold it (flushes first; in-memory recorders too)."""
        self.flush()
        if self.path is not None:
            return [json.loads(line) for line in self.path.read_bytes().splitlines() if line.strip()]
        header = {"t": "meta", "version": LOG_VERSION, "rank": self.rank, "pid": os.getpid(), "clock": "time_ns"}
        return [header, *(json.loads(_encode(item)) for item in self._memory)]

    def close(self) -> None:
        """Flush and close the log; the recorder records nothing afterwards."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(timeout=5)
        self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._wanted = _NothingWanted()

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.config.flush_interval):
            try:
                self.flush()
            except OSError:
                return

    def _cuda_ready(self) -> list[tuple[Any, ...]]:
        if not self._cuda_pending:
            return []
        ready: list[Any] = []
        waiting: list[Any] = []
        for item in self._cuda_pending:
            (ready if item[4].query() else waiting).append(item)
        self._cuda_pending = waiting
        return [("cuda", name, ts, tid, int(s.elapsed_time(e) * 1e6)) for name, ts, tid, s, e in ready]


class _NothingWanted(dict[str, bool]):
    """After close: every name is filtered out."""

    def get(self, key: str, default: Any = None) -> bool:
        return False


def _find(stack: list[tuple[str, int, Any, Any]] | None, name: str) -> int:
    if stack:
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == name:
                return i
    return -1


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _encode(item: tuple[Any, ...]) -> bytes:
    kind = item[0]
    if kind == "B":
        rec: dict[str, Any] = {"t": "B", "name": item[1], "ts": item[2], "tid": item[3], "d": item[4]}
        if item[5]:
            rec["args"] = dict(item[5])
    elif kind == "E":
        rec = {"t": "E", "name": item[1], "ts": item[2], "tid": item[3]}
    elif kind == "clock":
        rec = {"t": "clock", "ts": item[2], **item[1].as_dict()}
    else:  # cuda
        rec = {"t": "cuda", "name": item[1], "ts": item[2], "tid": item[3], "dur_ns": item[4]}
    return json.dumps(rec, separators=(",", ":"), default=str).encode() + b"\n"


def _cuda_module() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda if torch.cuda.is_available() else None
