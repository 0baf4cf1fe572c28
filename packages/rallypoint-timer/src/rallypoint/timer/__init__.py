"""rallypoint timers: watchdog timers that kill stuck workers, and the distributed event timeline.

Watchdog (worker side)::

    from rallypoint import timer

    with timer.expires(after=60, scope="data_load"):
        batch = next(loader)

Timeline (worker side)::

    with timer.event("step", step=i):
        ...
    timer.start_event("eval"); ...; timer.end_event("eval")
    timer.sync_clocks()            # after the process group is up: offset against rank 0
    trace = timer.get_timeline()   # every rank of every node of this attempt, on rank 0's clock
                                   # (a collective once the process group is up)

    client = timer.TimelineClient(config_path="timer_config.json", log_path="timer_events.log")

Importing this package is light: no torch, no pydantic. Hook specifications live in
:mod:`rallypoint.timer.hookspecs`; the agent-side servers in :mod:`rallypoint.timer.backends`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rallypoint.timer.client import TimelineClient
from rallypoint.timer.recorder import Event, Recorder
from rallypoint.timer.records import TimerBackendRecord
from rallypoint.timer.timeline import (
    configure_timeline,
    end_event,
    event,
    get_recorder,
    on_event_end,
    on_event_start,
    start_event,
)
from rallypoint.timer.timeline_config import TimelineConfig, TimelineError
from rallypoint.timer.watchdog import configure, expires, get_client
from rallypoint.timer.watchdog_core import (
    Expiry,
    TimerClient,
    WatchdogError,
    WatchdogServer,
    WatchdogUnavailableError,
)

if TYPE_CHECKING:
    from rallypoint.timer.clock import ClockEstimate, sync_clocks
    from rallypoint.timer.gather import get_timeline
    from rallypoint.timer.merge import Timeline

__all__ = [
    "TimerBackendRecord",
    # watchdog
    "Expiry",
    "TimerClient",
    "WatchdogError",
    "WatchdogServer",
    "WatchdogUnavailableError",
    "configure",
    "expires",
    "get_client",
    # timeline
    "ClockEstimate",
    "Event",
    "Recorder",
    "Timeline",
    "TimelineClient",
    "TimelineConfig",
    "TimelineError",
    "configure_timeline",
    "end_event",
    "event",
    "get_recorder",
    "get_timeline",
    "on_event_end",
    "on_event_start",
    "start_event",
    "sync_clocks",
]

_LAZY = {
    "ClockEstimate": "rallypoint.timer.clock",
    "sync_clocks": "rallypoint.timer.clock",
    "Timeline": "rallypoint.timer.merge",
    "get_timeline": "rallypoint.timer.gather",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rallypoint.timer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
