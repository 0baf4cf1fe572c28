"""The event timeline's API: named, nested spans recorded per worker by one process-wide recorder.

::

    from rallypoint import timer

    with timer.event("step", step=3):          # a context manager...
        with timer.event("forward"):
            ...
    timer.start_event("backward")                # ...explicit start / end...
    timer.end_event("backward")

    @timer.event("load_batch")                   # ...or a decorator
    def load_batch(): ...

The recorder (:class:`~rallypoint.timer.recorder.Recorder`, which also holds the log's format) is
created on first use. Its log goes to ``RALLYPOINT_TIMELINE_FILE`` (set by the agent to
``<log_dir>/attempt_N/timeline/rank_R.jsonl``), else to the config file's ``output``, else it
stays in memory. An optional JSON config file, named by ``RALLYPOINT_TIMELINE_CONFIG``, selects
what to record (:class:`~rallypoint.timer.timeline_config.TimelineConfig`).
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from rallypoint.timer.recorder import Callback, Recorder
from rallypoint.timer.timeline_config import TimelineConfig, TimelineError

__all__ = [
    "ENV_CONFIG",
    "ENV_FILE",
    "configure_timeline",
    "end_event",
    "event",
    "get_recorder",
    "on_event_end",
    "on_event_start",
    "start_event",
]

#: Worker env: the event log of this worker (set by the agent when ``[timer] timeline`` is on).
ENV_FILE = "RALLYPOINT_TIMELINE_FILE"
#: Worker env: a JSON config file (which events, output path, flush interval).
ENV_CONFIG = "RALLYPOINT_TIMELINE_CONFIG"

P = ParamSpec("P")
R = TypeVar("R")

#: The process-wide recorder (``None`` until first use).
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
