"""The event timeline: named, nested spans recorded per worker into an append-only JSON-lines log.

::

    from rallypoint import timer

    with timer.event("step", step=3):          # a context manager...
        with timer.event("forward"):
            ...
    timer.start_event("backward")                # ...explicit start / end...
    timer.end_event("backward")

    @timer.event("load_batch")                   # ...or a decorator
    def load_batch(): ...

Recording is cheap (a clock read and a list append at each end; see ``tools/bench/timer.py``):
the log is written by a background thread every ``flush_interval`` seconds, so a worker that
crashes loses at most the last interval. The log goes to ``RALLYPOINT_TIMELINE_FILE`` (set by the
agent to ``<log_dir>/attempt_N/timeline/rank_R.jsonl``), else to the config file's ``output``,
else it stays in memory.

An optional JSON config file, named by ``RALLYPOINT_TIMELINE_CONFIG``, selects what to record::

    {"events": ["step", "forward*"], "exclude": ["debug*"], "output": "tl/rank_{rank}.jsonl",
     "flush_interval": 0.5, "cuda": false}

Log lines (one JSON object each, ``t`` is the kind): ``meta`` (first line of each writer: rank,
pid, host, clock), ``B`` / ``E`` (start / end: ``name``, ``ts`` in ns, ``tid``, depth ``d``,
``args``), ``clock`` (an offset estimate against rank 0, see :mod:`rallypoint.timer.clock`),
``cuda`` (GPU time of a span).
"""

from __future__ import annotations

import atexit
import fnmatch
import functools
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

__all__ = [
    "ENV_CONFIG",
    "ENV_FILE",
    "Event",
    "Recorder",
    "TimelineConfig",
    "TimelineError",
    "configure_timeline",
    "end_event",
    "event",
    "get_recorder",
    "on_event_end",
    "on_event_start",
    "start_event",
]


class ClockRecord(Protocol):
    """A clock-offset estimate as the log takes it (:class:`rallypoint.timer.clock.ClockEstimate`)."""

    def as_dict(self) -> dict[str, Any]:
        """The fields of the log's ``clock`` line."""
        ...


#: Worker env: the event log of this worker (set by the agent when ``[timer] timeline`` is on).
ENV_FILE = "RALLYPOINT_TIMELINE_FILE"
#: Worker env: a JSON config file (which events, output path, flush interval).
ENV_CONFIG = "RALLYPOINT_TIMELINE_CONFIG"

LOG_VERSION = 1

P = ParamSpec("P")
R = TypeVar("R")


class TimelineError(RuntimeError):
    """Misuse of the timeline (an end without a start, a bad config file)."""


@dataclass(frozen=True)
class TimelineConfig:
    """What to record and where.

    Attributes:
        events: glob patterns of event names to record; ``None`` records every event.
        exclude: glob patterns never recorded (checked after ``events``).
        output: the log path when ``RALLYPOINT_TIMELINE_FILE`` is not set; ``{rank}`` is replaced.
        flush_interval: seconds between writes of the log (the most a crash can lose).
        cuda: also time spans with CUDA events when CUDA is in use.
    """

    events: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    output: str | None = None
    flush_interval: float = 1.0
    cuda: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "timeline config") -> TimelineConfig:
        """Validate a parsed JSON config; errors name the source and the key."""
        known = {"events", "exclude", "output", "flush_interval", "cuda"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TimelineError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")

        def patterns(key: str) -> tuple[str, ...] | None:
            value = data.get(key)
            if value is None:
                return None
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TimelineError(f"{source}: {key}: expected a list of event names or patterns")
            return tuple(value)

        interval = data.get("flush_interval", 1.0)
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise TimelineError(f"{source}: flush_interval: expected a positive number of seconds, got {interval!r}")
        output = data.get("output")
        if output is not None and not isinstance(output, str):
            raise TimelineError(f"{source}: output: expected a path, got {output!r}")
        cuda = data.get("cuda", False)
        if not isinstance(cuda, bool):
            raise TimelineError(f"{source}: cuda: expected true or false, got {cuda!r}")
        return cls(
            events=patterns("events"),
            exclude=patterns("exclude") or (),
            output=output,
            flush_interval=float(interval),
            cuda=cuda,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TimelineConfig:
        """Read a JSON config file."""
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise TimelineError(f"cannot read timeline config {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise TimelineError(f"{path}: not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise TimelineError(f"{path}: expected a JSON object")
        return cls.from_dict(data, source=str(path))

    def wants(self, name: str) -> bool:
        """Whether events called ``name`` are recorded."""
        if self.events is not None and not any(fnmatch.fnmatchcase(name, p) for p in self.events):
            return False
        return not any(fnmatch.fnmatchcase(name, p) for p in self.exclude)


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


# ------------------------------------------------------------------------------------------------
# The process-wide recorder and the module-level API

_recorder: Recorder | None = None
_init_lock = threading.Lock()


def _config_from_env() -> TimelineConfig:
    path = os.environ.get(ENV_CONFIG)
    return TimelineConfig.load(path) if path else TimelineConfig()


def get_recorder() -> Recorder:
    """The process-wide recorder, created on first use from the environment."""
    global _recorder
    if _recorder is not None:
        return _recorder
    with _init_lock:
        if _recorder is None:
            config = _config_from_env()
            rank = int(os.environ.get("RANK", "0") or 0)
            path = os.environ.get(ENV_FILE) or (config.output.format(rank=rank) if config.output else None)
            _recorder = Recorder(path, config=config, rank=rank)
            atexit.register(_recorder.close)
        return _recorder


def configure_timeline(
    path: str | os.PathLike[str] | None = None,
    *,
    config: TimelineConfig | str | os.PathLike[str] | None = None,
    rank: int | None = None,
    clock: Callable[[], int] | None = None,
) -> Recorder:
    """Replace the process-wide recorder (the previous one is closed).

    Args:
        path: the log file; default ``RALLYPOINT_TIMELINE_FILE``, then the config's ``output``.
        config: a :class:`TimelineConfig` or the path of a JSON config file; default
            ``RALLYPOINT_TIMELINE_CONFIG``.
        rank: default ``RANK``.
        clock: nanosecond clock (tests).
    """
    global _recorder
    cfg = (
        config
        if isinstance(config, TimelineConfig)
        else TimelineConfig.load(config)
        if config is not None
        else _config_from_env()
    )
    rank = int(os.environ.get("RANK", "0") or 0) if rank is None else rank
    if path is None:
        path = os.environ.get(ENV_FILE) or (cfg.output.format(rank=rank) if cfg.output else None)
    with _init_lock:
        old, _recorder = _recorder, Recorder(path, config=cfg, rank=rank, clock=clock or time.time_ns)
        atexit.register(_recorder.close)
    if old is not None:
        old.close()
    return _recorder


def start_event(name: str, args: Mapping[str, Any] | None = None, **attrs: Any) -> None:
    """Start event ``name`` on this thread; ``attrs`` (as for :class:`event`) and ``args`` show in the trace."""
    if attrs:
        args = {**(args or {}), **attrs}
    (_recorder or get_recorder()).start(name, args)


def end_event(name: str) -> None:
    """End the innermost open event ``name`` of this thread."""
    (_recorder or get_recorder()).end(name)


def on_event_start(callback: Callback) -> Callback:
    """Call ``callback(event)`` whenever an event starts (decorator-friendly)."""
    return get_recorder().on_start(callback)


def on_event_end(callback: Callback) -> Callback:
    """Call ``callback(event)`` whenever an event ends (decorator-friendly)."""
    return get_recorder().on_end(callback)


class event:  # lower case: used like a function, ``with event("x")`` / ``@event("x")``
    """Record a span: a context manager and a decorator.

    Args:
        name: the event name; as a decorator it defaults to the function's qualified name.
        **args: shown with the event in the trace.

    Example::

        with event("step", step=i):
            train_step()

        @event("load")
        def load(): ...
    """

    __slots__ = ("args", "name")

    def __init__(self, name: str | None = None, **args: Any) -> None:
        self.name = name
        self.args = args or None

    def __enter__(self) -> event:
        name = self.name
        if name is None:
            raise TimelineError("event() needs a name when used as a context manager")
        (_recorder or get_recorder()).start(name, self.args)
        return self

    def __exit__(self, *exc: object) -> None:
        (_recorder or get_recorder()).end(self.name or "")

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate ``fn``: each call is one event."""
        name: str = self.name or str(getattr(fn, "__qualname__", repr(fn)))
        args = self.args

        @functools.wraps(fn)
        def wrapper(*a: P.args, **k: P.kwargs) -> R:
            rec = _recorder or get_recorder()
            rec.start(name, args)
            try:
                return fn(*a, **k)
            finally:
                rec.end(name)

        return wrapper


def _reset_for_tests(recorder: Recorder | None = None) -> None:
    """Install ``recorder`` (or none) as the process-wide recorder without closing the old one."""
    global _recorder
    _recorder = recorder
