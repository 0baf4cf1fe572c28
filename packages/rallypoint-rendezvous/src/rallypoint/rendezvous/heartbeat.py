"""A node's heartbeat: a thread that writes it every interval, and what it knows of its own health.

The rendezvous handler gives it one beat to run (write this node's record, check the watched
peers); :class:`Heartbeat` runs it every ``heartbeat_interval`` and decides when the node has
failed. The rule is one of time, measured on this node's monotonic clock from its last beat
that succeeded: once ``heartbeat_timeout`` has passed without one, the node has failed. Its peers
declare it dead on the same timeout (their observation of its record lags its write, so they
never drop it sooner), so the node knows it is out of the job by the time they act.

The rule holds while a beat is still waiting for the backend: a call that hangs (a cut link, a
server that accepts connections and never answers) does not postpone the verdict.
:attr:`Heartbeat.failure` reads the clock and needs no I/O and no lock, so an agent can check it
at any moment and stop its workers ("fence" itself) within ``heartbeat_timeout`` of its last
successful beat, however long the backend takes to fail the call.

A beat that finds the run's state gone or corrupt (a
:class:`~rallypoint.rendezvous.errors.RendezvousStateError`) fails the node at once: no retry
can mend it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousHeartbeatError, RendezvousStateError
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = ["Heartbeat"]

log = logging.getLogger("rallypoint.rendezvous")


class Heartbeat:
    """The heartbeat thread of one node, and its verdict on the node's health.

    Args:
        node_id: the node (for messages).
        run_id: the run (for messages).
        timeouts: ``heartbeat_interval`` and ``heartbeat_timeout``.
        beat: one heartbeat (raises when it failed).
        clock: monotonic clock (tests pass a fake one).
        stop: set to end the thread (shared with the handler: setting it stops the beats, as if
            the process had frozen).
    """

    def __init__(
        self,
        node_id: str,
        run_id: str,
        timeouts: RendezvousTimeouts,
        beat: Callable[[], None],
        clock: Callable[[], float],
        stop: threading.Event,
    ) -> None:
        self.node_id = node_id
        self.run_id = run_id
        self.timeouts = timeouts
        self._beat = beat
        self._clock = clock
        self._stop = stop
        self._thread: threading.Thread | None = None
        self._failure: RendezvousHeartbeatError | RendezvousStateError | None = None
        self._last_ok = 0.0  # monotonic time of the last beat that succeeded (or of the start)
        self._attempts = 0  # failed beats since the last one that succeeded
        self._error: BaseException | None = None  # the last beat's error
        self._calling_since: float | None = None  # a beat in flight since then
        self._generation = 0  # a thread of an earlier generation (cleared, still in a call) changes nothing

    @property
    def running(self) -> bool:
        """The thread was started (and the node has not failed since)."""
        return self._thread is not None

    def start(self) -> None:
        """Start beating (the first beat one interval from now); idempotent."""
        if self._thread is not None:
            return
        # The first beat comes one interval from now, not at once: a peer that reads no heartbeat
        # record yet starts its timeout from that observation, and the record changes (appears)
        # well within heartbeat_timeout. Writing at once would put N more writes into the moment
        # N nodes join together.
        self._last_ok = self._clock()
        self._generation += 1
        self._thread = threading.Thread(
            target=self._loop, args=(self._generation,), name=f"rallypoint-heartbeat-{self.node_id}", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end (after :attr:`failure` or the stop event)."""
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    @property
    def failure(self) -> RendezvousHeartbeatError | RendezvousStateError | None:
        """Why the node failed, or ``None``; reads the clock, no I/O.

        A :class:`RendezvousHeartbeatError` once ``heartbeat_timeout`` has passed since the last
        beat that succeeded, even while a beat still waits for the backend; the
        :class:`RendezvousStateError` a beat found.
        """
        if self._failure is None and self._thread is not None and not self._stop.is_set():
            gap = self._clock() - self._last_ok
            if gap >= self.timeouts.heartbeat_timeout:
                self._fail(gap)
        return self._failure

    def lapsed_for(self) -> float:
        """Seconds since the last beat that succeeded (0 before the first start)."""
        return self._clock() - self._last_ok if self._thread is not None else 0.0

    def clear(self) -> RendezvousHeartbeatError | RendezvousStateError | None:
        """Forget the failure, so that a node that rejoins starts a new thread; returns it.

        The old thread is not waited for: it ends at its next wake-up, or when the beat it is
        still waiting for returns, and changes nothing then (a newer generation has started).
        """
        failure = self._failure
        if failure is None:
            return None
        self._thread = None
        self._failure = None
        self._attempts, self._error, self._calling_since = 0, None, None
        return failure

    def _fail(self, gap: float) -> None:
        error = self._error
        attempts = self._attempts
        calling = self._calling_since
        if calling is not None:  # the beat in flight counts: it has not succeeded either
            attempts += 1
            waited = self._clock() - calling
            error = RendezvousBackendError(
                f"a heartbeat call has waited {waited:.1f}s for the backend without an answer"
            )
        if error is None:  # the thread has not run a beat yet (it cannot be scheduled?)
            error = RendezvousBackendError("no heartbeat could be written yet")
        self._failure = RendezvousHeartbeatError(self.node_id, self.run_id, max(attempts, 1), gap, error)

    def _loop(self, generation: int) -> None:
        """Beat every interval until the node fails, the stop event is set or a newer thread started."""
        interval = self.timeouts.heartbeat_interval

        def over() -> bool:  # declared by time while a beat waited, or cleared: the node moved on
            return self._failure is not None or self._generation != generation

        while not self._stop.wait(interval):
            if over():
                return
            self._calling_since = self._clock()
            try:
                self._beat()
            except Exception as exc:  # noqa: BLE001 - retried, then reported as the node's failure
                if over():
                    return
                self._calling_since = None
                if self._attempts == 0:
                    log.warning("node %r: heartbeat failed (%s: %s); retrying", self.node_id, type(exc).__name__, exc)
                self._attempts += 1
                self._error = exc
                if isinstance(exc, RendezvousStateError):  # gone or corrupt: nothing to wait for
                    self._failure = exc
                    return
                gap = self._clock() - self._last_ok
                if gap >= self.timeouts.heartbeat_timeout:
                    self._fail(gap)  # the agent (or the caller) reports it: every later call raises it
                    return
                continue
            if over():
                return  # it succeeded after the verdict: the node stays failed (its peers may have acted)
            self._calling_since = None
            self._last_ok = self._clock()
            self._attempts, self._error = 0, None
