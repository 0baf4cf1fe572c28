"""A node's part in a run: what every job of a rendezvous handler shares.

A :class:`~rallypoint.rendezvous.handler.RendezvousHandler` joins rounds
(:mod:`~rallypoint.rendezvous.joining`), watches the running one
(:mod:`~rallypoint.rendezvous.monitoring`), closes the job or leaves it
(:mod:`~rallypoint.rendezvous.closing`) and beats (:meth:`Participant.beat`, run by
:mod:`~rallypoint.rendezvous.heartbeat`). Each of those works on one :class:`Participant`: the
backend, the state machine and its I/O, the lock that orders them, the clock, the hooks and the
heartbeat's verdict.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rallypoint.rendezvous.backend import RendezvousBackend
from rallypoint.rendezvous.errors import TimeoutInfo, extra_wait
from rallypoint.rendezvous.heartbeat import Heartbeat
from rallypoint.rendezvous.round_io import RendezvousResult, RoundIO
from rallypoint.rendezvous.state import Header, RendezvousStateMachine, Settings, count_key, nodes_waiting
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

if TYPE_CHECKING:
    from rallypoint.core.plugins import RallypointPluginManager

__all__ = ["Participant"]


@dataclass(eq=False)
class Participant:
    """One node's rendezvous state, shared by the handler's jobs.

    Attributes:
        backend: the key-value space.
        machine: the state machine (this node's record, its rounds).
        io: the machine's reads and writes against ``backend``.
        timeouts: every timeout.
        settings: the node range and timeouts the machine decides with.
        pm: the plugin manager whose rendezvous hooks fire (``None``: none).
        clock: monotonic clock.
        fingerprint: what this job runs (``None``: not checked).
        fixed_port: the master port this node always offers (``None``: a free one per round).
        lock: orders every step against the backend (the heartbeat's too).
        stop: set to stop the heartbeat.
        heartbeat: the heartbeat thread and its verdict (made by :meth:`start_heartbeat_thread`).
        checked_in: the first contact (:func:`~rallypoint.rendezvous.joining.check_in`) was made.
        last: the result of the last completed round.
    """

    backend: RendezvousBackend
    machine: RendezvousStateMachine
    io: RoundIO
    timeouts: RendezvousTimeouts
    settings: Settings
    pm: RallypointPluginManager | None
    clock: Callable[[], float]
    fingerprint: dict[str, Any] | None = None
    fixed_port: int | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    stop: threading.Event = field(default_factory=threading.Event)
    checked_in: bool = False
    last: RendezvousResult | None = None

    def __post_init__(self) -> None:
        self.heartbeat = Heartbeat(
            self.machine.node_id, self.backend.run_id, self.timeouts, self.beat, self.clock, self.stop
        )

    @property
    def run_id(self) -> str:
        """The job's run id."""
        return self.backend.run_id

    @property
    def node_id(self) -> str:
        """The node's id."""
        return self.machine.node_id

    def raise_failure(self) -> None:
        """Raise the heartbeat's verdict, if the node has failed."""
        failure = self.heartbeat.failure
        if failure is not None:
            raise failure

    def fire_timeout(self, info: TimeoutInfo, extended: int) -> float | None:
        """Call the ``timed_out`` hooks: the seconds to wait more, or ``None`` (raise)."""
        if self.pm is None:
            return None
        return extra_wait(self.pm.hook.rallypoint_rendezvous_timed_out(info=info), info, extended)

    def waiting(self, h: Header) -> int:
        """How many nodes wait for a new round, seen from header ``h`` (the lock is held)."""
        last = self.machine.last_round
        if last is None or h.closed:
            return 0
        entry = self.backend.get(count_key(h.round if h.round > last else h.round + 1))
        return nodes_waiting(last, h, 0 if entry is None else int(entry.value), self.settings.max_nodes)

    def beat(self) -> None:
        """One heartbeat, and the liveness check of the watched peers while a round runs."""
        with self.lock:
            self.io.heartbeat()
            if self.machine.last_round is None or self.machine.join_deadline != float("inf"):
                return  # next_rendezvous checks liveness while joining
            view = self.io.read()
            peers = self.machine.watched_peers(view.header)
            view = replace(view, heartbeats=self.io.read_heartbeats(peers))
            action = self.machine.check_peers(view, self.clock())
            if action is not None:
                self.io.apply(action)
