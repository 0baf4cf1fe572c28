"""The exit barrier: a node whose workers all succeeded waits for every node's before the job ends.

Each node adds one to ``agent/done/<round>`` when its workers finished; the job is done when the
count reaches the round's node count. Meanwhile one read of the round header per wait decides
whether the job ended otherwise (closed by another node) or the round was superseded (a newer
round opened: this round's success is not the job's, see :mod:`rallypoint.agent.rejoin`). After
``exit_barrier_timeout`` the node stops waiting and counts its round as done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rallypoint.agent.settings import Outcome

if TYPE_CHECKING:
    from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult

__all__ = ["exit_barrier"]


def _done_key(round_: int) -> str:
    return f"agent/done/{round_}"


def exit_barrier(
    handler: RendezvousHandler, result: RendezvousResult, timeout: float, say: Callable[[str], None]
) -> Outcome:
    """Wait until every node of round ``result`` finished.

    Returns:
        ``SUCCEEDED`` when they did (or the barrier timed out), ``MEMBERSHIP`` when the round
        restarted meanwhile, ``CLOSED`` when another node closed the job as failed.
    """
    backend = handler.backend
    key = _done_key(result.round)
    backend.add(key, 1)
    deadline = time.monotonic() + timeout
    while True:
        entry = backend.get(key)
        if entry is not None and int(entry.value) >= result.num_nodes:
            return Outcome.SUCCEEDED
        # one read of the header decides: a close by another node between two reads was
        # taken for a membership change (and a finished job for a failed one)
        status = handler.round_status()
        if status.closed:
            return Outcome.CLOSED if status.failed else Outcome.SUCCEEDED
        if status.superseded:
            return Outcome.MEMBERSHIP
        left = deadline - time.monotonic()
        if left <= 0:
            done = int(entry.value) if entry else 0
            say(f"exit barrier: {done} of {result.num_nodes} node(s) finished within {timeout:g}s; exiting anyway")
            return Outcome.SUCCEEDED
        backend.watch(key, version=entry.version if entry else None, timeout=min(left, 0.5))
