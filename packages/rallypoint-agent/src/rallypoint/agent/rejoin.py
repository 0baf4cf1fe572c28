"""Rejoining the job after this node lost the rendezvous.

A host whose link to the rendezvous backend stays down for longer than ``heartbeat_timeout`` is
taken for dead: its peers drop it from the round and train on without it. Its agent learns it
one of two ways: its own heartbeat could not be written for ``heartbeat_timeout`` (the handler
raises :class:`~rallypoint.rendezvous.errors.RendezvousHeartbeatError` caused by a
:class:`~rallypoint.rendezvous.errors.RendezvousBackendError`), or the backend answers again and
the round it runs is over, opened anew because of its missing heartbeat.

Like a lost peer host (:mod:`rallypoint.agent.peers`), this is a membership change, not a worker
failure: the agent stops its workers (they belong to a round it is no longer part of), counts
no restart, says how long it lost the rendezvous, and joins the next round once its heartbeat
can be written again. While the backend does not answer, :func:`rejoin` retries with backoff;
once ``join_timeout`` has passed since the node started rejoining it gives up
(:class:`RejoinTimedOut`) and the agent fails, naming the backend's endpoint and how long it
tried. A backend that answers every call but this node's heartbeat fails the same way (after
the join timeout), rather than dropping the node from every round it joins.

Only an unreachable backend is ridden out: a rendezvous whose state is gone or corrupt (a
:class:`~rallypoint.rendezvous.errors.RendezvousStateError`, e.g. a deleted run directory)
still fails the node at once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rallypoint.agent.settings import Outcome

if TYPE_CHECKING:
    from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult

__all__ = [
    "INITIAL_BACKOFF",
    "MAX_BACKOFF",
    "Lost",
    "RejoinTimedOut",
    "dropped_message",
    "hosted_by",
    "lost_contact",
    "lost_message",
    "reached_message",
    "refused",
    "rejoin",
    "rejoin_failed_message",
    "server_lost_message",
    "succeeded_without_message",
    "superseded_message",
    "waiting_message",
    "workers_fate",
]

#: The first wait between two tries of an unreachable backend, in seconds (doubled after each try).
INITIAL_BACKOFF = 0.5
#: The longest wait between two tries, in seconds; shorter with a shorter ``heartbeat_interval``
#: (a node that rejoins tries no more often than its heartbeat would have written).
MAX_BACKOFF = 5.0


def lost_contact(exc: BaseException) -> bool:
    """Whether ``exc`` says the rendezvous backend could not be reached (the node may rejoin).

    A heartbeat failure counts when its cause is a backend error; a state error (the run's
    state deleted or corrupt) does not: there is no job left to rejoin.
    """
    from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousHeartbeatError

    if isinstance(exc, RendezvousHeartbeatError):
        return isinstance(exc.error, RendezvousBackendError)
    return isinstance(exc, RendezvousBackendError)


@dataclass(frozen=True)
class Lost:
    """A node that lost the rendezvous, while it rejoins.

    Attributes:
        round: the round it was dropped from, or ``None`` when it was waiting for one.
        last_contact: monotonic time of its last answer from the backend.
        started: monotonic time it started rejoining (the join timeout counts from here).
        workers: what became of its workers in that round, for messages ("were stopped"...).
        first: it never reached the rendezvous yet (its first contact: no heartbeat to write).
        server: ``HOST:PORT`` of the agent that served the rendezvous, when the rendezvous
            lived and died with that agent (see :func:`hosted_by`): once nothing listens there
            any more (connection refused) for ``heartbeat_timeout``, the node fails, naming it.
    """

    round: int | None
    last_contact: float
    started: float
    workers: str
    first: bool = False
    server: str | None = None

    @property
    def lost_for(self) -> float:
        """Seconds from the last answer to the start of the rejoin."""
        return max(0.0, self.started - self.last_contact)


class RejoinTimedOut(Exception):
    """The backend did not answer again within the join timeout.

    Attributes:
        attempts: how many times the node tried to join.
        seconds: how long it tried.
        error: the last backend error.
        gone: the agent that served the rendezvous is gone (its port refuses connections).
    """

    def __init__(self, attempts: int, seconds: float, error: BaseException, *, gone: bool = False) -> None:
        self.attempts = attempts
        self.seconds = seconds
        self.error = error
        self.gone = gone
        super().__init__(f"{attempts} attempt(s) over {seconds:.1f}s; last: {type(error).__name__}: {error}")


def rejoin(
    handler: RendezvousHandler,
    lost: Lost,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RendezvousResult:
    """Join the next round after a lost rendezvous; retry an unreachable backend with backoff.

    Args:
        handler: this node's rendezvous handler (a heartbeat failure it holds is cleared).
        lost: when the node lost the rendezvous and started rejoining.
        clock: monotonic clock (tests pass a fake one).
        sleep: waits between two tries.

    Returns:
        The round this node joined.

    Raises:
        RejoinTimedOut: the backend still did not answer ``join_timeout`` after ``lost.started``.
        RendezvousClosedError: the job was closed meanwhile.
        RendezvousError: any other error of :meth:`~RendezvousHandler.next_rendezvous` (a state
            error, a join timeout of a backend that answers).
    """
    from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousHeartbeatError

    deadline = lost.started + handler.timeouts.join
    longest = min(MAX_BACKOFF, max(0.1, handler.timeouts.heartbeat_interval))
    delay = min(INITIAL_BACKOFF, longest)
    attempts = 0
    while True:
        handler.clear_failure()
        attempts += 1
        try:
            # first its own heartbeat: a node whose heartbeats still cannot be written would be
            # dropped again from every round it joins (a first contact has none yet)
            if not lost.first:
                handler.io.heartbeat()
            return handler.next_rendezvous()
        except (RendezvousBackendError, RendezvousHeartbeatError) as exc:
            if not lost_contact(exc):
                raise
            error = exc.error if isinstance(exc, RendezvousHeartbeatError) else exc
        left = deadline - clock()
        waited = clock() - lost.started
        gone = lost.server is not None and waited >= handler.timeouts.heartbeat_timeout and refused(lost.server)
        if left <= 0 or gone:
            raise RejoinTimedOut(attempts, waited, error, gone=gone)
        sleep(min(delay, left))
        delay = min(2 * delay, longest)


# -- what the agent says ------------------------------------------------------------------------
def workers_fate(outcome: Outcome | None) -> str:
    """What became of the workers of a round whose node lost the rendezvous.

    Args:
        outcome: how they had ended when it happened (``None``: they were running;
            ``MEMBERSHIP``: the node was waiting for a round, none ran).
    """
    if outcome is Outcome.SUCCEEDED:
        return "its workers had finished"
    if outcome is Outcome.FAILED:
        return "its workers had failed (not counted: the failure could not be recorded)"
    if outcome is Outcome.MEMBERSHIP:
        return "no worker ran"
    return "its workers were stopped"


def lost_message(lost: Lost, exc: BaseException, endpoint: str, join_timeout: float) -> str:
    """The one line an agent prints when it lost the rendezvous and starts rejoining."""
    from rallypoint.rendezvous.errors import RendezvousHeartbeatError

    beat = isinstance(exc, RendezvousHeartbeatError)
    cause = exc.error if isinstance(exc, RendezvousHeartbeatError) else exc
    where = f"round {lost.round}" if lost.round is not None else "the rendezvous while it waited for a round"
    return (
        f"lost the rendezvous for {lost.lost_for:.1f}s ({'its heartbeat' if beat else 'it'} could not reach the "
        f"rendezvous ({endpoint}): {type(cause).__name__}: {cause}); dropped from {where}, {lost.workers}; "
        f"rejoining, no restart counted (retried until the join timeout, {join_timeout:g}s)"
    )


def dropped_message(round_: int, reason: str, gap: float) -> str:
    """What a node says when the backend answers again and its round was reopened without it."""
    return (
        f"this node was dropped from round {round_} ({reason}): it lost the rendezvous for about {gap:.1f}s; "
        "its workers were stopped; rejoining, no restart counted"
    )


def superseded_message(round_: int, what: str) -> str:
    """A round's outcome that the job has left behind: this node's workers ``what`` ("failed"...)."""
    return (
        f"round {round_}'s workers {what}, but the job went on in a newer round without this node "
        "(it was dropped while it could not reach the rendezvous): that outcome is not the job's; "
        "rejoining, no restart counted"
    )


def hosted_by(backend: object) -> str | None:
    """``HOST:PORT`` of the agent that serves ``backend``'s rendezvous, when the rendezvous dies with it.

    A backend says so with a ``hosted_by`` attribute (the gRPC backend when another node's agent
    serves it and keeps nothing on disk); ``None`` for a rendezvous that outlives any one node.
    """
    endpoint = getattr(backend, "hosted_by", None)
    return endpoint if isinstance(endpoint, str) and endpoint else None


def refused(endpoint: str, timeout: float = 1.0) -> bool:
    """Whether ``HOST:PORT`` actively refuses a TCP connection: its host answers, nothing listens.

    That tells a server that is gone (its agent died, its host is up) from one that cannot be
    reached (a cut link, a host that is down: the connection times out), which may come back.
    """
    host, _, port = endpoint.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):
        return False


def waiting_message(exc: BaseException, endpoint: str, join_timeout: float) -> str:
    """What a node says when the rendezvous does not answer its first contact (it waits for it)."""
    return (
        f"the rendezvous ({endpoint}) does not answer yet ({type(exc).__name__}: {exc}); waiting for it "
        f"until the join timeout ({join_timeout:g}s): the agent that serves it, or the server, may start later"
    )


def reached_message(waited: float) -> str:
    """What a node says when its first contact finally reached the rendezvous."""
    return f"reached the rendezvous after waiting {waited:.1f}s for it"


def server_lost_message(lost: Lost, exc: RejoinTimedOut) -> str:
    """Why a node fails when the agent that served the rendezvous is gone."""
    host = (lost.server or "").rpartition(":")[0].strip("[]")
    return (
        f"this node fails: the rendezvous was served by the agent on {host} ({lost.server}), and nothing listens "
        f"there any more (connection refused, {exc.seconds:.1f}s after this node's heartbeat failed): that agent "
        "is gone, and the job's rendezvous state with it (it kept none on disk). Start the job again; to let a "
        "job outlive the agent that serves its rendezvous, set rendezvous.options.data_dir (its agent restarted "
        "on that host serves the same state) or use a standalone server (rallypoint rdzv serve) or etcd"
    )


def rejoin_failed_message(exc: RejoinTimedOut, endpoint: str, join_timeout: float, *, first: bool = False) -> str:
    """Why a node that could not rejoin (or, ``first``, never reached the rendezvous) fails."""
    if first:
        return (
            f"this node fails: the rendezvous ({endpoint}) did not answer within the join timeout "
            f"({join_timeout:g}s, {exc.attempts} attempt(s)); last error {type(exc.error).__name__}: {exc.error}. "
            "Check the endpoint, that the server (or the agent that serves it) runs, and that this host reaches "
            "it (network, firewall), or raise rendezvous.join_timeout"
        )
    return (
        f"this node fails: it could not rejoin the job, the rendezvous ({endpoint}) did not answer for "
        f"{exc.seconds:.1f}s of retries ({exc.attempts} attempt(s), join timeout {join_timeout:g}s); last error "
        f"{type(exc.error).__name__}: {exc.error}. Check that this host reaches it (network, firewall, the "
        "server's host), or raise rendezvous.join_timeout"
    )


def succeeded_without_message(run_id: str, reason: str, lost: Lost) -> str:
    """What a dropped node says when the job succeeded while it was rejoining (it exits 0)."""
    where = f"round {lost.round}" if lost.round is not None else "the rendezvous while it waited for a round"
    return (
        f"job {run_id!r} succeeded without this node ({reason}): it was dropped from {where} when it lost the "
        f"rendezvous ({lost.workers}) and ran no worker in the rounds that finished the job; exit 0 for the "
        "job's outcome"
    )
