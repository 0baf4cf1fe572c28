"""What a member checks while its workers run: the round over or closed, nodes waiting.

An agent polls these between its workers' exits (see
:meth:`RendezvousHandler.round_status <rallypoint.rendezvous.handler.RendezvousHandler.round_status>`):
each reads the round header (and the wait list's count) under the participant's lock, after the
heartbeat's verdict, so a node that has failed learns it here first.
"""

from __future__ import annotations

from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint.rendezvous.participant import Participant
from rallypoint.rendezvous.result import RoundStatus

__all__ = ["is_closed", "nodes_waiting", "round_is_over", "round_status"]


def is_closed(node: Participant) -> bool:
    """Whether the rendezvous was closed (the job is over)."""
    with node.lock:
        return node.io.read().header.closed


def round_status(node: Participant) -> RoundStatus:
    """Closed (and why), how many nodes wait, and whether a newer round opened; one header read."""
    node.raise_failure()
    # A heartbeat that waits for the backend holds the lock; the caller (a monitor) must not
    # wait longer than a beat would, nor past its own failure (see Heartbeat.failure).
    if not node.lock.acquire(timeout=node.timeouts.heartbeat_interval):
        node.raise_failure()
        raise RendezvousBackendError(f"node {node.node_id!r}'s heartbeat is still waiting for the rendezvous backend")
    try:
        last = node.machine.last_round
        h = node.io.read().header
        waiting = node.waiting(h)
    finally:
        node.lock.release()
    superseded = last is not None and h.round > last
    return RoundStatus(closed=h.closed, failed=h.failed, reason=h.reason, waiting=waiting, superseded=superseded)


def nodes_waiting(node: Participant) -> int:
    """How many nodes wait for a new round (see :func:`~rallypoint.rendezvous.state.nodes_waiting`)."""
    node.raise_failure()
    with node.lock:
        return node.waiting(node.io.read().header)


def round_is_over(node: Participant) -> bool:
    """Whether the round this node last completed has been superseded or closed."""
    node.raise_failure()
    with node.lock:
        last = node.machine.last_round
        h = node.io.read().header
        return last is not None and (h.closed or h.round > last)
