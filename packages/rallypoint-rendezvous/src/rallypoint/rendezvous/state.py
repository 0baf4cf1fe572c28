"""The rendezvous algorithm as a pure state machine.

Nothing here does I/O or reads a clock: the caller passes what it read from the backend (a
:class:`View`) and its own monotonic time ``now``; the machine answers with one action to carry
out (write a join record, compare-and-set the round header, wait, ...). The handler
(:mod:`rallypoint.rendezvous.handler`) executes actions against a backend; the property tests
execute them against random schedules.

The protocol, per round ``r``:

* A joining node writes its record ``join/<r>/<node>`` and increments ``round/count/<r>``.
* When ``max`` nodes have joined, or ``last_call`` seconds (of the observer's clock) after the
  observer first saw ``min`` joined, some node compare-and-sets the round header from "round
  ``r`` open" to "round ``r`` complete, participants [...]". Only one such write can succeed, so
  every member reads the same participant list; a node's group rank is its index in that list.
* Who acts: records are written before the counter, and a joiner reads the counter after its
  own increment, so the node whose increment brings the count to ``min`` (or ``max``) always
  sees it and drives the round from there (last call, completion). Every other node waits on
  the round header alone (:class:`Wait`): it is not woken by each join, so ``N`` joins cost
  ``O(N)`` wake-ups, not ``O(N^2)``. Should that node die before completing, the others take
  over at their next periodic check (every ``heartbeat_interval``), which reads the records.
* A node arriving while round ``r`` is complete writes ``join/<r+1>/<node>`` and waits (the wait
  list); members see it through :func:`nodes_waiting`.
* A member that wants a new round (restart, scale-up, a dead peer, a node restarted under the
  same id) compare-and-sets the header to "round ``r+1`` open".
* Liveness: each node watches the heartbeat records of its two successors in the ring of
  members. A peer whose record has not changed for ``heartbeat_timeout`` of the observer's own
  monotonic time is dead (:class:`LivenessTracker`); no two hosts' clocks are ever compared.
* Closing sets ``closed`` in the header: the job is over for everyone (a node that merely leaves
  does not close the rendezvous).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rallypoint.rendezvous.backend import Version
from rallypoint.rendezvous.errors import RendezvousStateError, TimeoutInfo
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = [
    "HEADER_KEY",
    "Action",
    "CasHeader",
    "Closed",
    "Finished",
    "Header",
    "JoinRecord",
    "LivenessTracker",
    "Member",
    "NeedHeartbeats",
    "NeedJoins",
    "NodeInfo",
    "RemoveJoins",
    "RendezvousStateMachine",
    "Settings",
    "TimedOut",
    "View",
    "Wait",
    "WriteJoin",
    "count_key",
    "heartbeat_key",
    "join_key",
    "join_prefix",
    "nodes_waiting",
    "ring_successors",
]

FORMAT = 1
HEADER_KEY = "round/header"
ROUND_PREFIX = "round/"
TICKET_KEY = "ticket"


def count_key(round_: int) -> str:
    """Key of the join counter of ``round_``."""
    return f"round/count/{round_}"


def join_prefix(round_: int) -> str:
    """Prefix of the join records of ``round_``."""
    return f"join/{round_}/"


def join_key(round_: int, node_id: str) -> str:
    """Key of ``node_id``'s join record in ``round_``."""
    return f"join/{round_}/{node_id}"


def heartbeat_key(node_id: str) -> str:
    """Key of ``node_id``'s heartbeat record."""
    return f"hb/{node_id}"


def _require(cond: bool, what: str, data: Any) -> None:
    if not cond:
        raise RendezvousStateError(f"malformed rendezvous {what}: {data!r}")


@dataclass(frozen=True)
class NodeInfo:
    """What a node tells the others about itself.

    Attributes:
        node_id: identity, unique in the job and stable across restarts of the same node
            (``[A-Za-z0-9._~:@+=,-]``).
        host: host name.
        addr: address other nodes and workers can reach this node at.
        local_world_size: number of workers this node runs.
        labels: free-form string labels (rack, zone, GPU model...), used by rank strategies.
        master_port: a port this node offers for the workers' store (used when it becomes
            group rank 0); ``None`` lets the handler pick one.
        env: environment facts the node shares with the others, e.g. the ranks a scheduler
            gave it (``SLURM_PROCID``...), so that every agent's rank strategy sees them.
        previous_rank: the lowest global rank this node's workers had in the last round it ran,
            or ``None``; rank strategies use it to keep ranks stable across rounds.
    """

    node_id: str
    host: str
    addr: str
    local_world_size: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)
    master_port: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    previous_rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "id": self.node_id,
            "host": self.host,
            "addr": self.addr,
            "lws": self.local_world_size,
            "labels": dict(self.labels),
            "port": self.master_port,
            "env": dict(self.env),
            "prev": self.previous_rank,
        }

    @classmethod
    def from_json(cls, data: Any) -> NodeInfo:
        """Parse the JSON form (raises :class:`RendezvousStateError` when malformed)."""
        _require(isinstance(data, dict) and isinstance(data.get("id"), str), "node record", data)
        try:
            return cls(
                node_id=data["id"],
                host=str(data["host"]),
                addr=str(data["addr"]),
                local_world_size=int(data["lws"]),
                labels={str(k): str(v) for k, v in data["labels"].items()},
                master_port=None if data.get("port") is None else int(data["port"]),
                env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
                previous_rank=None if data.get("prev") is None else int(data["prev"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RendezvousStateError(f"malformed rendezvous node record: {data!r} ({exc})") from exc


@dataclass(frozen=True)
class JoinRecord:
    """A node's record in one round (``join/<r>/<node>``).

    Attributes:
        node: the node's description.
        incarnation: random id of the process incarnation (a node restarted with the same
            ``node_id`` gets a new one).
        ticket: arrival order (a job-wide atomic counter).
        prev_rank: the node's group rank in the round it last completed, to keep ranks stable.
    """

    node: NodeInfo
    incarnation: str
    ticket: int
    prev_rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"node": self.node.to_json(), "inc": self.incarnation, "ticket": self.ticket, "prev": self.prev_rank}

    @classmethod
    def from_json(cls, data: Any) -> JoinRecord:
        """Parse the JSON form."""
        _require(isinstance(data, dict) and "node" in data and isinstance(data.get("inc"), str), "join record", data)
        try:
            return cls(
                NodeInfo.from_json(data["node"]),
                data["inc"],
                int(data["ticket"]),
                None if data.get("prev") is None else int(data["prev"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RendezvousStateError(f"malformed rendezvous join record: {data!r} ({exc})") from exc

    def order(self) -> tuple[int, int, int, str]:
        """Sort key: previous members first in their previous order, then arrival order."""
        prev = -1 if self.prev_rank is None else self.prev_rank
        return (0 if self.prev_rank is not None else 1, prev, self.ticket, self.node.node_id)


@dataclass(frozen=True)
class Member:
    """A participant of a completed round: node id and incarnation."""

    node_id: str
    incarnation: str


@dataclass(frozen=True)
class Header:
    """The small round header (``round/header``).

    Attributes:
        round: the round number, starting at 0.
        complete: whether the round's membership is fixed.
        participants: the members in group-rank order (only when complete).
        closed: the job is over.
        reason: why this round was opened (for logs and ``rallypoint status``).
    """

    round: int = 0
    complete: bool = False
    participants: tuple[Member, ...] = ()
    closed: bool = False
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "format": FORMAT,
            "round": self.round,
            "complete": self.complete,
            "participants": [[m.node_id, m.incarnation] for m in self.participants],
            "closed": self.closed,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Any) -> Header:
        """Parse the JSON form (raises :class:`RendezvousStateError` when malformed or foreign)."""
        _require(isinstance(data, dict) and data.get("format") == FORMAT, "round header", data)
        try:
            return cls(
                round=int(data["round"]),
                complete=bool(data["complete"]),
                participants=tuple(Member(str(a), str(b)) for a, b in data["participants"]),
                closed=bool(data["closed"]),
                reason=str(data.get("reason", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RendezvousStateError(f"malformed rendezvous round header: {data!r} ({exc})") from exc

    def member_ids(self) -> list[str]:
        """Participant node ids in rank order."""
        return [m.node_id for m in self.participants]

    def rank_of(self, node_id: str, incarnation: str) -> int | None:
        """The group rank of that node incarnation, or ``None``."""
        for rank, m in enumerate(self.participants):
            if m.node_id == node_id and m.incarnation == incarnation:
                return rank
        return None


@dataclass(frozen=True)
class Settings:
    """Size limits and timeouts of the rendezvous."""

    min_nodes: int
    max_nodes: int
    timeouts: RendezvousTimeouts = field(default_factory=RendezvousTimeouts)
    run_id: str = ""

    def __post_init__(self) -> None:
        if self.min_nodes < 1 or self.max_nodes < self.min_nodes:
            raise ValueError(f"need 1 <= min_nodes <= max_nodes, got min={self.min_nodes} max={self.max_nodes}")


@dataclass(frozen=True)
class View:
    """What a node read from the backend for one step.

    Attributes:
        header: the round header (``Header()`` when none exists yet).
        header_version: its version, ``None`` when absent.
        count: the join counter of ``header.round`` (a hint; records are authoritative).
        joins: the join records of ``header.round`` when read (see :class:`NeedJoins`).
        heartbeats: heartbeat values of the requested nodes (``None`` for absent records).
    """

    header: Header
    header_version: Version | None
    count: int = 0
    joins: Mapping[str, JoinRecord] | None = None
    heartbeats: Mapping[str, Any] | None = None


# -- actions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteJoin:
    """Write this node's join record for ``round`` (and count it if it is new)."""

    round: int
    record: JoinRecord


@dataclass(frozen=True)
class CasHeader:
    """Compare-and-set the header from ``expected`` to ``header``; on failure, read again."""

    expected: Version | None
    header: Header


@dataclass(frozen=True)
class RemoveJoins:
    """Delete the join records of dead nodes from ``round`` (and uncount them)."""

    round: int
    node_ids: tuple[str, ...]


@dataclass(frozen=True)
class NeedJoins:
    """Read the join records of the header's round and step again."""


@dataclass(frozen=True)
class NeedHeartbeats:
    """Read the heartbeat records of ``node_ids`` and step again."""

    node_ids: tuple[str, ...]


@dataclass(frozen=True)
class Wait:
    """Nothing to do until the round header changes or ``until`` (the caller's clock) passes.

    The caller watches :data:`HEADER_KEY` from the version in the :class:`View` it stepped
    with (so a change made after that read wakes it at once) and steps again on a change or at
    ``until``. Joins of other nodes need not wake a waiter: the joiner that brings the count to
    ``min`` or ``max`` sees it itself (see the module docstring), and ``until`` is never later
    than the next periodic check, which reads the records.
    """

    until: float


@dataclass(frozen=True)
class Finished:
    """The node is a member of the completed round ``header.round`` with group ``rank``."""

    header: Header
    rank: int


@dataclass(frozen=True)
class Closed:
    """The rendezvous is closed."""


@dataclass(frozen=True)
class TimedOut:
    """The join timeout expired."""

    info: TimeoutInfo


Action = WriteJoin | CasHeader | RemoveJoins | NeedJoins | NeedHeartbeats | Wait | Finished | Closed | TimedOut


# -- liveness -------------------------------------------------------------------------------


class LivenessTracker:
    """Decides which peers are dead from observations of their heartbeat records.

    A peer is dead when its heartbeat value has not changed for ``timeout`` seconds of the
    observer's own clock, counted from the first time the observer saw that value. The value's
    content (a counter, an incarnation) is never interpreted as a time.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._seen: dict[str, tuple[Any, float]] = {}

    def observe(self, node_id: str, value: Any, now: float) -> None:
        """Record that ``node_id``'s heartbeat value is ``value`` at ``now``."""
        last = self._seen.get(node_id)
        if last is None or last[0] != value:
            self._seen[node_id] = (value, now)

    def is_dead(self, node_id: str, now: float) -> bool:
        """Whether ``node_id`` has been seen unchanged for the timeout (never observed: alive)."""
        last = self._seen.get(node_id)
        return last is not None and now - last[1] >= self.timeout

    def forget(self, node_id: str) -> None:
        """Drop what is known about ``node_id``."""
        self._seen.pop(node_id, None)


def ring_successors(ids: Sequence[str], me: str, k: int = 2) -> tuple[str, ...]:
    """The (up to) ``k`` nodes after ``me`` in the ring ``ids``; each node watches those."""
    if me not in ids or len(ids) < 2:
        return tuple(i for i in ids[:k] if i != me) if me not in ids else ()
    pos = ids.index(me)
    out: list[str] = []
    for step in range(1, min(k, len(ids) - 1) + 1):
        out.append(ids[(pos + step) % len(ids)])
    return tuple(out)


def nodes_waiting(last_round: int, header: Header, count_next: int, max_nodes: int) -> int:
    """How many nodes wait for a new round, as seen by a member of ``last_round``.

    Args:
        last_round: the round this node completed.
        header: the current header.
        count_next: the join counter of round ``header.round + 1`` when ``header.round ==
            last_round``, else of ``header.round``.
        max_nodes: the job's maximum.

    Returns:
        0 while the round runs and nobody waits (or the round is full, so waiting nodes are
        spares); otherwise at least 1: the agent should stop its workers and re-rendezvous.
    """
    if header.closed:
        return 0
    if header.round > last_round:
        return max(1, count_next)
    if header.complete and len(header.participants) < max_nodes:
        return max(0, count_next)
    return 0


def _no_heartbeat(dead: Sequence[str]) -> str:
    return "no heartbeat from " + ", ".join(repr(d) for d in dead)


# -- the machine ----------------------------------------------------------------------------


class RendezvousStateMachine:
    """One node's view of the rendezvous algorithm.

    Args:
        node: this node.
        incarnation: unique per process incarnation (a restart under the same node id must
            use a new one).
        settings: limits and timeouts.

    Use :meth:`begin` at the start of each ``next_rendezvous``, then :meth:`step` until it
    returns :class:`Finished`, :class:`Closed` or :class:`TimedOut`; between steps, execute the
    action. :meth:`check_peers` runs while a round is in progress (from the heartbeat loop).
    """

    def __init__(self, node: NodeInfo, incarnation: str, settings: Settings) -> None:
        self.node = node
        self.incarnation = incarnation
        self.settings = settings
        self.liveness = LivenessTracker(settings.timeouts.heartbeat_timeout)
        self.last_round: int | None = None
        self.last_rank: int | None = None
        self.last_header: Header | None = None
        self.join_deadline = float("inf")
        self._min_seen_at: dict[int, float] = {}
        self._written: dict[int, int] = {}  # round -> ticket of our record there
        self._next_check = 0.0
        self._present: tuple[str, ...] = ()
        self._ticket: int | None = None

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def node_id(self) -> str:
        """The id of the node this machine runs for."""
        return self.node.node_id

    def begin(self, now: float) -> None:
        """Start a ``next_rendezvous`` attempt at ``now`` (starts the join timeout).

        The first liveness check of the peers is one ``heartbeat_interval`` away: a check reads
        every join record of the round, and a peer can only be found dead ``heartbeat_timeout``
        after it was first observed anyway. Checking at once would make ``N`` simultaneous
        joiners read ``O(N^2)`` records for nothing.
        """
        self.join_deadline = now + self.settings.timeouts.join
        self._next_check = now + self.settings.timeouts.heartbeat_interval

    def set_ticket(self, ticket: int) -> None:
        """Give this node its arrival ticket (from an atomic add, once per incarnation)."""
        self._ticket = ticket

    @property
    def ticket(self) -> int | None:
        """The arrival ticket, once assigned."""
        return self._ticket

    def record_for(self, round_: int) -> JoinRecord:
        """The join record the node writes for ``round_``."""
        return JoinRecord(self.node, self.incarnation, self._ticket or 0, self.last_rank)

    def joined(self, round_: int) -> None:
        """The handler wrote our join record for ``round_``."""
        self._written[round_] = 1

    def forget_joins(self) -> None:
        """Our join records were withdrawn; the next attempt writes them again."""
        self._written.clear()
        self._min_seen_at.clear()

    # -- main step ---------------------------------------------------------------------
    def step(self, view: View, now: float) -> Action:
        """Decide the next action from ``view`` at time ``now``."""
        h = view.header
        s = self.settings
        if h.closed:
            return Closed()
        me = self.node_id
        if h.complete:
            rank = h.rank_of(me, self.incarnation)
            if rank is not None and (self.last_round is None or h.round > self.last_round):
                return self._finish(h, rank)
            if now >= self.join_deadline:
                return self._timeout(h, view)
            ids = h.member_ids()
            if rank is not None or me in ids:
                # We were a member (and want a new round), or our previous incarnation was.
                why = f"node {me!r} left round {h.round}" if rank is not None else f"node {me!r} restarted"
                return CasHeader(view.header_version, Header(round=h.round + 1, reason=why))
            # A late arrival: wait for the next round (the wait list).
            if h.round + 1 not in self._written:
                return WriteJoin(h.round + 1, self.record_for(h.round + 1))
            if now >= self._next_check:
                # Watch the first members too, in case every member is gone.
                watched = ring_successors(ids, me)
                if view.heartbeats is None or any(w not in view.heartbeats for w in watched):
                    return NeedHeartbeats(watched)
                self._next_check = now + s.timeouts.heartbeat_interval
                dead = self._dead(watched, view.heartbeats, now)
                if dead:
                    return CasHeader(view.header_version, Header(round=h.round + 1, reason=_no_heartbeat(dead)))
            return Wait(min(self.join_deadline, self._next_check))

        # The round is open.
        r = h.round
        if r not in self._written:
            return WriteJoin(r, self.record_for(r))
        check_due = now >= self._next_check
        if view.count < s.min_nodes and not check_due and now < self.join_deadline:
            self._min_seen_at.pop(r, None)
            return Wait(min(self.join_deadline, self._next_check))
        if view.joins is None:
            return NeedJoins()
        joins = view.joins
        if me not in joins or joins[me].incarnation != self.incarnation:
            # Our record vanished (we were taken for dead) or belongs to an old incarnation.
            return WriteJoin(r, self.record_for(r))
        ordered = sorted(joins.values(), key=JoinRecord.order)
        ids = [j.node.node_id for j in ordered]
        self._present = tuple(ids)
        if check_due:
            watched = ring_successors(ids, me)
            if view.heartbeats is None or any(w not in view.heartbeats for w in watched):
                return NeedHeartbeats(watched)
            self._next_check = now + s.timeouts.heartbeat_interval
            dead = self._dead(watched, view.heartbeats, now)
            if dead:
                return RemoveJoins(r, dead)
        if now >= self.join_deadline:
            return self._timeout(h, view)
        n = len(ordered)
        if n >= s.max_nodes:
            return self._complete(view, ordered[: s.max_nodes])
        if n >= s.min_nodes:
            seen = self._min_seen_at.setdefault(r, now)
            if now >= seen + s.timeouts.last_call:
                return self._complete(view, ordered)
            return Wait(min(self.join_deadline, seen + s.timeouts.last_call, self._next_check))
        self._min_seen_at.pop(r, None)
        return Wait(min(self.join_deadline, self._next_check))

    def _dead(self, watched: Sequence[str], heartbeats: Mapping[str, Any], now: float) -> tuple[str, ...]:
        for w in watched:
            self.liveness.observe(w, heartbeats.get(w), now)
        dead = tuple(w for w in watched if self.liveness.is_dead(w, now))
        for d in dead:
            self.liveness.forget(d)
        return dead

    def _complete(self, view: View, members: Sequence[JoinRecord]) -> CasHeader:
        header = Header(
            round=view.header.round,
            complete=True,
            participants=tuple(Member(j.node.node_id, j.incarnation) for j in members),
            reason=view.header.reason,
        )
        return CasHeader(view.header_version, header)

    def _finish(self, header: Header, rank: int) -> Finished:
        self.last_round = header.round
        self.last_rank = rank
        self.last_header = header
        self.join_deadline = float("inf")
        for r in [r for r in self._written if r <= header.round]:
            del self._written[r]
        self._min_seen_at.clear()
        return Finished(header, rank)

    def _timeout(self, header: Header, view: View) -> TimedOut:
        present = self._present if not header.complete else ()
        prev = self.last_header.member_ids() if self.last_header else []
        missing = tuple(i for i in prev if i not in present and i != self.node_id)
        info = TimeoutInfo(
            run_id=self.settings.run_id,
            round=header.round + (1 if header.complete else 0),
            timeout="join",
            seconds=self.settings.timeouts.join,
            node_id=self.node_id,
            present=tuple(present),
            missing=missing,
            min_nodes=self.settings.min_nodes,
            max_nodes=self.settings.max_nodes,
        )
        return TimedOut(info)

    # -- while a round runs ------------------------------------------------------------
    def watched_peers(self, header: Header) -> tuple[str, ...]:
        """The members whose heartbeats this node checks while ``header``'s round runs."""
        return ring_successors(header.member_ids(), self.node_id)

    def check_peers(self, view: View, now: float) -> CasHeader | None:
        """Check the watched members' heartbeats in a running round.

        ``view.heartbeats`` must hold the values of :meth:`watched_peers`. Returns the header
        write that opens the next round when one of them is dead, else ``None``.
        """
        h = view.header
        if h.closed or not h.complete or self.last_round != h.round or view.heartbeats is None:
            return None
        dead = self._dead(self.watched_peers(h), view.heartbeats, now)
        if not dead:
            return None
        return CasHeader(view.header_version, Header(round=h.round + 1, reason=_no_heartbeat(dead)))

    def leave_header(self, view: View) -> CasHeader | None:
        """The header write announcing that this node leaves its running round, if it is in one."""
        h = view.header
        if h.closed or not h.complete or h.rank_of(self.node_id, self.incarnation) is None:
            return None
        return CasHeader(view.header_version, Header(round=h.round + 1, reason=f"node {self.node_id!r} left"))

    def close_header(self, view: View) -> CasHeader | None:
        """The header write that closes the rendezvous (``None`` when already closed)."""
        if view.header.closed:
            return None
        return CasHeader(view.header_version, replace(view.header, closed=True))
