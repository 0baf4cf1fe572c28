"""``TimelineClient``: the event timeline as one object, built from a config file and a log path.

::

    from rallypoint.timer import TimelineClient

    client = TimelineClient(config_path="timer_config.json", log_path="timer_events.log",
                            on_event_start=print, on_event_end=print)
    with client.event("step", step=1):
        client.start_event("forward", micro_batch=0)
        ...
        client.end_event("forward")
    timeline = client.get_timeline()   # every rank of every node, on rank 0's clock

The client installs its recorder as the process-wide one, so :func:`rallypoint.timer.event` and
friends record into the same log. Importing this module does not import torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rallypoint.timer.recorder import Callback, Recorder
from rallypoint.timer.timeline import ENV_CONFIG, ENV_FILE, configure_timeline
from rallypoint.timer.timeline_config import TimelineConfig

if TYPE_CHECKING:
    from rallypoint.timer.clock import ClockEstimate
    from rallypoint.timer.merge import Timeline

__all__ = ["TimelineClient", "rank_log_path"]


def rank_log_path(log_path: str | os.PathLike[str], rank: int, world_size: int) -> Path:
    """Where rank ``rank`` writes when the user names one log path for every rank.

    ``{rank}`` in the path is replaced; a path without it is used as is by a single worker, and
    gets ``.rank<R>`` before its suffix when there are several (``timer_events.log`` becomes
    ``timer_events.rank1.log``): ranks never append to one file.
    """
    text = os.fspath(log_path)
    if "{rank}" in text:
        return Path(text.replace("{rank}", str(rank)))
    path = Path(text)
    if world_size <= 1:
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


class TimelineClient:
    """One worker's event timeline, configured from files.

    Args:
        config_path: a JSON timeline config (which events, flush interval, CUDA spans; see
            :class:`~rallypoint.timer.timeline_config.TimelineConfig`). Default: the file the agent
            names in ``RALLYPOINT_TIMELINE_CONFIG`` (``[timer] timeline_config``), else record
            everything.
        log_path: the JSON-lines log to append to (see :func:`rank_log_path` for several
            ranks). Default: ``RALLYPOINT_TIMELINE_FILE`` (set by the agent when
            ``[timer] timeline`` is on), else the config's ``output``, else in memory.
        on_event_start: called with each :class:`~rallypoint.timer.recorder.Event` as it starts.
        on_event_end: called with each event as it ends (``end_ns`` set).

    Raises:
        rallypoint.timer.TimelineError: the config file is missing or invalid (the error names it).
    """

    def __init__(
        self,
        config_path: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        on_event_start: Callback | None = None,
        on_event_end: Callback | None = None,
    ) -> None:
        rank = int(os.environ.get("RANK", "0") or 0)
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        source = config_path if config_path is not None else os.environ.get(ENV_CONFIG) or None
        self.config = TimelineConfig.load(source) if source is not None else TimelineConfig()
        path: Path | None
        if log_path is not None:
            path = rank_log_path(log_path, rank, world)
        elif os.environ.get(ENV_FILE):
            path = Path(os.environ[ENV_FILE])
        else:
            path = Path(self.config.output.format(rank=rank)) if self.config.output else None
        self.recorder: Recorder = configure_timeline(path, config=self.config, rank=rank)
        if on_event_start is not None:
            self.recorder.on_start(on_event_start)
        if on_event_end is not None:
            self.recorder.on_end(on_event_end)

    @property
    def log_path(self) -> Path | None:
        """The log this worker writes (``None``: events are kept in memory)."""
        return self.recorder.path

    @property
    def rank(self) -> int:
        """The worker's rank."""
        return self.recorder.rank

    def start_event(self, name: str, args: Mapping[str, Any] | None = None, **attrs: Any) -> None:
        """Start event ``name`` on this thread; ``attrs`` (and ``args``) are shown in the trace."""
        if attrs:
            args = {**(args or {}), **attrs}
        self.recorder.start(name, args)

    def end_event(self, name: str) -> None:
        """End the innermost open event ``name`` of this thread.

        Raises:
            rallypoint.timer.TimelineError: no event of that name is open on this thread.
        """
        self.recorder.end(name)

    def event(self, name: str, **attrs: Any) -> _ClientEvent:
        """A span as a context manager: ``with client.event("step", step=i): ...``."""
        return _ClientEvent(self.recorder, name, attrs or None)

    def on_event_start(self, callback: Callback) -> Callback:
        """Call ``callback(event)`` whenever an event starts (usable as a decorator)."""
        return self.recorder.on_start(callback)

    def on_event_end(self, callback: Callback) -> Callback:
        """Call ``callback(event)`` whenever an event ends (usable as a decorator)."""
        return self.recorder.on_end(callback)

    def sync_clocks(self, **kwargs: Any) -> ClockEstimate:
        """Estimate the clock offset against rank 0 (a collective: :func:`rallypoint.timer.clock.sync_clocks`)."""
        from rallypoint.timer.clock import sync_clocks

        return sync_clocks(recorder=self.recorder, **kwargs)

    def get_timeline(self, timeout: float = 600.0) -> Timeline:
        """Every rank of every node of this attempt, on rank 0's clock.

        With the process group up this is a collective (every rank calls it) that gathers the
        ranks' records through the job's store, clocks synchronised first; without one, it is
        this worker's own events.

        Args:
            timeout: seconds to wait for every rank to call it; then a ``TimelineError`` names
                the ranks that did not.
        """
        from rallypoint.timer.gather import gather_timeline, process_group_ready
        from rallypoint.timer.merge import Timeline, load_records

        if process_group_ready():
            return gather_timeline(recorder=self.recorder, timeout=timeout)
        return Timeline([load_records(self.recorder.records(), rank=self.recorder.rank)])

    def flush(self) -> None:
        """Write what was recorded so far to the log."""
        self.recorder.flush()

    def close(self) -> None:
        """Flush and close the log; nothing is recorded afterwards."""
        self.recorder.close()

    def __enter__(self) -> TimelineClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _ClientEvent:
    """``with client.event(name, **attrs)``: one span on the client's recorder."""

    __slots__ = ("_args", "_name", "_recorder")

    def __init__(self, recorder: Recorder, name: str, args: Mapping[str, Any] | None) -> None:
        self._recorder = recorder
        self._name = name
        self._args = args

    def __enter__(self) -> _ClientEvent:
        self._recorder.start(self._name, self._args)
        return self

    def __exit__(self, *exc: object) -> None:
        self._recorder.end(self._name)
