"""What the agent needs of a watchdog timer backend (``[timer] watchdog``).

The agent does not depend on ``rallypoint-timer``: a backend's ``start_server(run_dir, options)``
returns an object with the shape of :class:`WatchdogServer`, and the expiries it reports have the
shape of :class:`WatchdogExpiry`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

__all__ = ["WatchdogExpiry", "WatchdogServer", "expired_reason"]


class WatchdogExpiry(Protocol):
    """What the agent reads of an expired watchdog timer (``rallypoint.timer``'s ``Expiry``)."""

    @property
    def pid(self) -> int:
        """The worker process that held the timer."""

    @property
    def scope(self) -> str:
        """The timer's scope name."""

    @property
    def deadline(self) -> float:
        """When it expired (seconds since the epoch)."""

    @property
    def acquired_at(self) -> float:
        """When it was acquired (``nan`` when unknown)."""

    def describe(self) -> str:
        """One line for people."""


class WatchdogServer(Protocol):
    """The agent-side watchdog a timer backend's ``start_server(run_dir, options)`` returns."""

    def worker_env(self, rank: int) -> Mapping[str, str]:
        """Variables that connect worker ``rank`` to this server."""

    def register_worker(self, pid: int, rank: int) -> None:
        """Tell the server which rank a worker process runs."""

    def set_expiry_handler(self, callback: Callable[[WatchdogExpiry], None] | None) -> None:
        """Call ``callback`` with each timer that expires."""

    def stop(self) -> None:
        """Stop serving."""


def expired_reason(expiry: WatchdogExpiry, killed: str, diagnosis: str | None = None) -> str:
    """The failure reason of a worker killed because its timer expired (``killed``: how it ended).

    ``diagnosis``: the hang's diagnosis line (:mod:`rallypoint.agent.debug_hang`), added when known.
    """
    held = expiry.deadline - expiry.acquired_at if expiry.acquired_at == expiry.acquired_at else None
    reason = f"watchdog timer {expiry.scope!r} expired" + (f" after {held:.3g}s" if held else "")
    reason += f", killed ({killed})"
    return reason + (f"; hang {diagnosis}" if diagnosis else "")
