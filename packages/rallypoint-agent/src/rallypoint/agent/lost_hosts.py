"""A fixed allocation that lost a host: the job cannot go on, and every survivor reports the lost host.

Elsewhere a job that lost a node below ``nodes.min`` waits for a replacement until the join
timeout (a restarted host, a new pod). Under a scheduler whose allocation is fixed (Slurm: the
job's nodes are the ones it was given, and a dead one is not replaced while the job runs,
:attr:`~rallypoint.agent.settings.AgentSettings.fixed_allocation`), nothing will come: the
survivors close the job as failed at once, with one root-cause report that names the lost host.

:func:`silent_members` finds the members of a round whose heartbeat stopped (read a few
heartbeat intervals apart, after the rendezvous has opened a new round because of them);
:func:`lost_host_failures` turns each of their workers into a failure every node's report shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rallypoint.agent.report import WorkerFailure

if TYPE_CHECKING:
    from rallypoint.agent.ranks import RankAssignment
    from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult

__all__ = ["fatal_losses", "lost_host_failures", "silent_members"]


def silent_members(
    handler: RendezvousHandler,
    result: RendezvousResult,
    *,
    reads: int = 3,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """The node ids of the round's other members whose heartbeat record did not change.

    Read ``reads`` times, one ``heartbeat_interval`` apart (a live agent writes its record every
    interval). A backend that does not answer gives ``[]``: nothing is known to be lost.
    """
    from rallypoint.rendezvous.errors import RendezvousBackendError

    peers = tuple(p.node_id for p in result.participants if p.node_id != handler.node_id)
    if not peers:
        return []
    seen: list[dict[str, object]] = []
    for i in range(reads):
        if i:
            sleep(handler.timeouts.heartbeat_interval)
        try:
            seen.append(dict(handler.io.read_heartbeats(peers)))
        except RendezvousBackendError:
            return []
    return [p for p in peers if all(read.get(p) == seen[0].get(p) for read in seen)]


def fatal_losses(
    handler: RendezvousHandler, result: RendezvousResult, assignment: RankAssignment, attempt: int, allocation: str
) -> list[WorkerFailure]:
    """The failures of the lost hosts' workers when too few nodes are left for the job; ``[]`` when it goes on.

    Called under a fixed allocation (of the launch environment ``allocation``, ``"slurm"``) once
    the round ``result`` is over because of a peer.
    """
    needed = handler.settings.min_nodes
    lost = silent_members(handler, result)
    if not lost or len(result.participants) - len(lost) >= needed:
        return []
    return lost_host_failures(lost, result, assignment, attempt=attempt, needed=needed, allocation=allocation)


def lost_host_failures(
    lost: Sequence[str],
    result: RendezvousResult,
    assignment: RankAssignment,
    *,
    attempt: int,
    needed: int,
    allocation: str,
) -> list[WorkerFailure]:
    """One failure for each worker of the ``lost`` nodes, saying why the job cannot go on without them.

    Every survivor publishes the same ones (a failure's key is its node and rank): the report
    has each once, whoever wrote it.
    """
    hosts = {p.node_id: p.host for p in result.participants}
    left = len(result.participants) - len(lost)
    now = time.time()
    failures = []
    for node_id in lost:
        host = hosts.get(node_id, node_id)
        reason = (
            f"host {host} was lost (node {node_id!r} stopped heart-beating); {left} node(s) are left, the job needs "
            f"{needed}, and the {allocation} allocation has no other host"
        )
        for w in assignment.for_node(node_id):
            failures.append(
                WorkerFailure(
                    rank=w.rank,
                    local_rank=w.local_rank,
                    host=host,
                    node_id=node_id,
                    attempt=attempt,
                    pid=0,
                    exit_code=None,
                    signal=None,
                    time=now,
                    reason=reason,
                )
            )
    return failures
