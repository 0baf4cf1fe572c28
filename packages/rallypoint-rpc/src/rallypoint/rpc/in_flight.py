"""The calls a worker sent that are not answered yet, counted for the graceful shutdown.

A graceful shutdown (:mod:`~rallypoint.rpc.api`) waits until no call sent from this worker is
outstanding before the group-wide drain; :class:`InFlight` is that count and the wait.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rallypoint.rpc.futures import Future

__all__ = ["InFlight"]


class InFlight:
    """How many calls sent from one worker wait for their reply."""

    def __init__(self) -> None:
        self._outstanding = 0
        self._lock = threading.Condition()

    def count(self, delta: int) -> None:
        """One call more (``+1``) or one answered (``-1``)."""
        with self._lock:
            self._outstanding += delta
            if not self._outstanding:
                self._lock.notify_all()

    def track(self, fut: Future[Any]) -> None:
        """Count a call until its future completes."""
        self.count(1)
        fut._add_callback(lambda _: self.count(-1))

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no call is outstanding; ``False`` if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._outstanding:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(left)
        return True
