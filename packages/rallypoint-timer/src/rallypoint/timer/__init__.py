"""rallypoint timers: watchdog timers that kill stuck workers, and the distributed event timeline.

Hook specifications live in :mod:`rallypoint.timer.hookspecs`.
"""

from rallypoint.timer.records import TimerBackendRecord

__all__ = ["TimerBackendRecord"]
