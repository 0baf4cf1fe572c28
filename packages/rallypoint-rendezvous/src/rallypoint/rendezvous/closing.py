"""How a node's part in a run ends: the job closed for every node, or this node leaving.

:func:`close` marks the run closed (first a marker, so that a node checking in meanwhile takes no
ticket, then the closed header), optionally only while a given round is still the current one.
:func:`leave` withdraws this node: leaving a running round opens the next one, so the other
members notice.
"""

from __future__ import annotations

from rallypoint.rendezvous.errors import RendezvousTimeoutError, TimeoutInfo
from rallypoint.rendezvous.participant import Participant
from rallypoint.rendezvous.state import CLOSED_KEY

__all__ = ["close", "leave"]


def close(node: Participant, reason: str = "", *, failed: bool = False, round_: int | None = None) -> bool:
    """Close the rendezvous for every node.

    The arguments are :meth:`~rallypoint.rendezvous.handler.RendezvousHandler.set_closed`'s.

    Returns:
        ``True`` when the rendezvous is closed (by this call or before); ``False`` when a
        newer round than ``round_`` has opened: nothing was closed.

    Raises:
        RendezvousTimeoutError: the close did not succeed within the close timeout.
    """
    deadline = node.clock() + node.timeouts.close
    extended = 0
    marked = False
    while True:
        with node.lock:
            view = node.io.read()
            if round_ is not None and not view.header.closed and view.header.round != round_:
                if marked:  # the marker of a close that did not happen: take it back
                    node.backend.delete(CLOSED_KEY)
                return False
            action = node.machine.close_header(view, reason, failed=failed)
            if action is None:
                return True
            if not marked:  # first the marker: from now on a node checking in takes no ticket
                node.backend.set(CLOSED_KEY, {"by": node.node_id, "reason": reason, "failed": failed})
                marked = True
            if node.io.apply(action):
                return True
        if node.clock() >= deadline:
            info = TimeoutInfo(
                node.run_id,
                view.header.round,
                "close",
                node.timeouts.close,
                node.node_id,
                min_nodes=node.settings.min_nodes,
                max_nodes=node.settings.max_nodes,
            )
            more = node.fire_timeout(info, extended)
            if more is not None:
                extended += 1
                deadline = node.clock() + more
                continue
            raise RendezvousTimeoutError(info, "Another node kept rewriting the round header")


def leave(node: Participant) -> None:
    """Withdraw this node from the run (a running round it was in gives way to the next)."""
    with node.lock:
        view = node.io.read()
        action = node.machine.leave_header(view)
        if action is not None:
            node.io.apply(action)
        node.io.withdraw()
