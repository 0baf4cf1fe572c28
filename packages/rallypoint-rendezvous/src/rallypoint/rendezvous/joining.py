"""How a node joins a round: the first contact with a run, then the steps until a round completes.

:func:`join` is the loop behind
:meth:`RendezvousHandler.next_rendezvous <rallypoint.rendezvous.handler.RendezvousHandler.next_rendezvous>`:
under the participant's lock the state machine decides the next step from what it reads, the
step is applied, and between steps the node waits on a watch of the round header (a change since
the step's read returns at once, so no wake-up is lost). The first call makes
:func:`check_in`: a run that has already ended, or a different job under the same run id, is
refused before anything is written.
"""

from __future__ import annotations

from dataclasses import replace

from rallypoint.rendezvous.backend import HeldWatch
from rallypoint.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousFinishedError,
    RendezvousJobMismatchError,
    RendezvousTimeoutError,
)
from rallypoint.rendezvous.participant import Participant
from rallypoint.rendezvous.round_io import RendezvousResult, free_port
from rallypoint.rendezvous.state import JOB_KEY, Closed, Finished, TimedOut, View, Wait

__all__ = ["check_in", "join"]


def join(node: Participant, held: HeldWatch | None) -> RendezvousResult:
    """Take part in rounds until this node is a member of a completed one; returns its result.

    ``held``: a watch on the header held since before its first read (the first wait uses it).
    Fires ``rallypoint_rendezvous_completed`` with the result.
    """
    known = _begin(node)  # a view the next step may use without reading again
    node.heartbeat.start()
    extended = 0
    while True:
        node.raise_failure()
        with node.lock:
            action, view = node.io.decide(node.clock(), known)
            known = None
            if isinstance(action, Finished):
                result = node.io.result(action)
                node.last = result
                break
            if isinstance(action, Closed):
                raise RendezvousClosedError(node.run_id)
            if isinstance(action, TimedOut):
                more = node.fire_timeout(action.info, extended)
                if more is not None:  # a hook answered WaitMore: stay in the round
                    extended += 1
                    node.machine.join_deadline = node.clock() + more
                    continue
                node.io.withdraw()
                raise RendezvousTimeoutError(action.info)
            if not isinstance(action, Wait):
                node.io.apply(action)
                known = node.io.view_after(action, view)
                continue
        timeout = max(0.0, action.until - node.clock())
        if held is not None:  # the first wait: on the watch held since before the first read
            known, held = node.io.wait_held(held, view, timeout), None
        else:
            # Watch the header from the version this step read: a change made since then
            # (the round completed, a new round opened) returns at once, so no wake-up is lost.
            known = node.io.wait_header(view, timeout)
    if node.pm is not None:
        node.pm.hook.rallypoint_rendezvous_completed(info=result)
    return result


def _begin(node: Participant) -> View | None:
    """Check in (the first time), pick this round's port, take a ticket and start the machine."""
    known: View | None = None
    with node.lock:
        if not node.checked_in:
            known = check_in(node)
        if node.fixed_port is None:
            node.machine.node = replace(node.machine.node, master_port=free_port())
        node.io.ensure_ticket()
        node.machine.begin(node.clock())
    return known


def check_in(node: Participant) -> View:
    """First contact: refuse a finished run, and a different job under the same run id.

    Returns the view it read (the first step may use it).
    """
    fingerprint = node.fingerprint
    view, entry = node.io.check_in(None if fingerprint is None else (JOB_KEY, fingerprint))
    header = view.header
    if header.closed:
        raise RendezvousFinishedError(node.run_id, header.reason, failed=header.failed)
    if fingerprint is not None:
        if entry is None:  # a close is under way (its marker stopped the claim): claim now
            _, entry = node.backend.compare_and_set(JOB_KEY, fingerprint, version=None)
        if entry is not None and entry.value != fingerprint:
            theirs = entry.value if isinstance(entry.value, dict) else {"job": entry.value}
            raise RendezvousJobMismatchError(node.run_id, theirs, fingerprint)
    node.checked_in = True
    return view
