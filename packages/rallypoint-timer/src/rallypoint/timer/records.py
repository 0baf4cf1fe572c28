"""Registration records of watchdog timer backends."""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.core.records import BackendRecord
from rallypoint.core.registry import PluginKind, SpecialValue

__all__ = ["TIMER_BACKENDS", "TimerBackendRecord"]


@dataclass(frozen=True, kw_only=True)
class TimerBackendRecord(BackendRecord):
    """A watchdog timer backend, selected with ``[timer] watchdog = "<name>"``.

    Attributes:
        factory: import path of the backend: it provides the server the agent runs and the
            client workers use to acquire and release timers.
        options_model: pydantic model of ``[timer.options]``.
    """


#: The watchdog-backend kind, declared by this package: ``pm.registry(TIMER_BACKENDS)``.
#: ``timer.watchdog = "off"`` is not a backend name: it disables the watchdog.
TIMER_BACKENDS: PluginKind[TimerBackendRecord] = PluginKind(
    hook="rallypoint_timer_backends",
    label="timer backend",
    record_class=TimerBackendRecord,
    config_key="timer.watchdog",
    special=(SpecialValue("off", "disabled"),),
)
