"""Registration records of watchdog timer backends."""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.core.records import BackendRecord

__all__ = ["TimerBackendRecord"]


@dataclass(frozen=True, kw_only=True)
class TimerBackendRecord(BackendRecord):
    """A watchdog timer backend, selected with ``[timer] watchdog = "<name>"``.

    Attributes:
        factory: import path of the backend: it provides the server the agent runs and the
            client workers use to acquire and release timers.
        options_model: pydantic model of ``[timer.options]``.
    """
