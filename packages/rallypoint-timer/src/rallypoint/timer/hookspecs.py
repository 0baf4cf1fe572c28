"""Hook specifications of ``rallypoint-timer``."""

from __future__ import annotations

from collections.abc import Iterable

from rallypoint.core.plugins import hookspec
from rallypoint.timer.records import TimerBackendRecord


@hookspec
def rallypoint_timer_backends() -> Iterable[TimerBackendRecord]:
    """Register watchdog timer backends.

    Returns:
        :class:`~rallypoint.timer.records.TimerBackendRecord` records, selected by
        ``[timer] watchdog`` (``off`` selects none).

    Example::

        @hookimpl
        def rallypoint_timer_backends():
            return [TimerBackendRecord(name="socket", factory="my_timer:SocketTimers")]
    """
    return ()
