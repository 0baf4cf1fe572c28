"""Fencing: a node that lost the rendezvous stops its workers within ``heartbeat_timeout``.

When this node's heartbeat has not been written for ``heartbeat_timeout`` (the link or the
backend is down), its peers take it for dead and go on in a new round without it. Its workers
would be training with a world that has moved on: they must stop, whatever the agent's monitor
is doing at that moment (it may be waiting for a read from the same unreachable backend).

:class:`Fence` is a thread that, while a round's workers run, polls the handler's own verdict
(:attr:`~rallypoint.rendezvous.handler.RendezvousHandler.failure`: a clock reading, no I/O) and
stops the workers as soon as it is given. The agent's monitor then raises that failure and the
agent rejoins (see :mod:`rallypoint.agent.rejoin`). The workers stop within
``heartbeat_timeout`` of the last heartbeat that was written, plus one poll and the stop grace.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rallypoint.agent.workers import WorkerGroup
    from rallypoint.rendezvous.handler import RendezvousHandler

__all__ = ["Fence"]


class Fence:
    """Stops a round's workers once this node's heartbeat failed; use as a context manager.

    Args:
        handler: this node's rendezvous handler.
        group: the round's workers.
        grace: seconds between SIGTERM and SIGKILL (``agent.stop_grace``).
        say: prints one agent line.
        poll: seconds between two looks at the handler's verdict.
    """

    def __init__(
        self,
        handler: RendezvousHandler,
        group: WorkerGroup,
        *,
        grace: float,
        say: Callable[[str], None],
        poll: float,
    ) -> None:
        self._handler = handler
        self._group = group
        self._grace = grace
        self._say = say
        self._poll = poll
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rallypoint-fence", daemon=True)
        #: Set once the fence stopped the workers.
        self.fenced = threading.Event()

    def __enter__(self) -> Fence:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=self._grace + 15)

    def _watch(self) -> None:
        while not self._done.wait(self._poll):
            failure = self._handler.failure
            if failure is None:
                continue
            timeout = self._handler.timeouts.heartbeat_timeout
            self._say(
                f"fencing: this node's heartbeat has not reached the rendezvous for heartbeat_timeout ({timeout:g}s); "
                "its peers drop it from the round: stopping its workers"
            )
            self.fenced.set()
            self._group.stop(grace=self._grace)
            return
