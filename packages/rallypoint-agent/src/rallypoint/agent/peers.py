"""Whether this node's workers failed because a peer host vanished.

When a whole host dies (power, kernel panic, every process SIGKILLed), the workers on the other
hosts fail at their next collective (a connection reset by the dead peer), usually well before
the rendezvous declares that host dead (``heartbeat_timeout``). Counted as worker failures, an
infrastructure fault would spend the job's restart budget (torchrun counts them: with
``max_restarts = 0`` the job ends). Here such failures are a membership change: before a
failure is counted, :func:`vanished_peer` checks whether the other members of the round are
alive.

The check reads only the rendezvous: every member's heartbeat record changes every
``heartbeat_interval`` while its agent lives. Once every other member's record has changed
since the failure, all of them are alive and the failure is the workers' own (the check took
at most about one interval). A member whose record does not change is dead or cut off; its
watchers then open a new round within ``heartbeat_timeout``, and the check returns that
round's reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult, RoundStatus

__all__ = ["round_stands", "running_status", "vanished_peer"]


def running_status(handler: RendezvousHandler) -> RoundStatus | None:
    """The round's status while workers run, or ``None`` when the backend does not answer.

    A rendezvous server that restarts, or a shared file system that stalls, must not stop
    workers that train fine: only this node's heartbeat, failing for ``heartbeat_timeout``,
    ends the node (:class:`~rallypoint.rendezvous.errors.RendezvousHeartbeatError` is raised).
    """
    from rallypoint.rendezvous.errors import RendezvousBackendError

    try:
        return handler.round_status()
    except RendezvousBackendError:
        return None


def vanished_peer(
    handler: RendezvousHandler,
    result: RendezvousResult,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Why the round ``result`` is over because of a peer, or ``None`` when every peer is alive.

    Args:
        handler: this node's rendezvous handler (its heartbeat keeps running meanwhile).
        result: the round whose workers failed.
        clock: monotonic clock (tests pass a fake one).
        sleep: waits between two reads.

    Returns:
        The reason of the new round (e.g. ``"node 'b-17' stopped heart-beating"``) when the
        round is over, or ``None``: every other member's heartbeat moved (the failure is the
        workers' own), the job was closed, or no new round opened within ``heartbeat_timeout``
        plus two intervals (counted as a failure, as before).

    Raises:
        RendezvousHeartbeatError: this node's own heartbeat kept failing.
    """
    me = handler.node_id
    peers = tuple(p.node_id for p in result.participants if p.node_id != me)
    if not peers:
        return None
    timeouts = handler.timeouts
    deadline = clock() + timeouts.heartbeat_timeout + 2 * timeouts.heartbeat_interval
    first = _heartbeats(handler, peers)
    while True:
        status = running_status(handler)  # None, like the heartbeats: no answer this time
        if status is not None and status.closed:
            return None
        if status is not None and (status.superseded or status.waiting > 0):
            return status.reason or f"round {result.round} is over"
        now = _heartbeats(handler, peers)
        if first is None:
            first = now
        elif now is not None and all(now[p] != first[p] for p in peers):
            return None
        if clock() >= deadline:
            return None
        sleep(min(0.1, timeouts.heartbeat_interval / 4))


def _heartbeats(handler: RendezvousHandler, peers: tuple[str, ...]) -> dict[str, Any] | None:
    from rallypoint.rendezvous.errors import RendezvousBackendError

    try:
        return handler.io.read_heartbeats(peers)
    except RendezvousBackendError:
        return None


def round_stands(handler: RendezvousHandler, every: float = 1.0) -> Callable[[], bool]:
    """A check whether the current round stands (this node in it, no node waiting, not closed).

    The check reads the round's status at most once every ``every`` seconds; while the backend
    does not answer, the round counts as standing (see :func:`running_status`).
    """
    last = [time.monotonic(), True]

    def stands() -> bool:
        if handler.failure is not None:
            return False
        if time.monotonic() - float(last[0]) >= every:
            status = running_status(handler)
            last[:] = [time.monotonic(), status is None or not (status.closed or status.waiting > 0)]
        return bool(last[1])

    return stands
