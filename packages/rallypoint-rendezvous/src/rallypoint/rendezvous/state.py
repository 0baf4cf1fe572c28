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
  The participants' records go to one roster record first (``roster/<r>/<digest>``, see
  :mod:`rallypoint.rendezvous.roster`) and the header names its digest: the header stays small,
  and each member reads the whole membership in one read (once per process).
* Who acts: records are written before the counter, and the node whose own increment brings
  the count to ``min`` (or ``max``) drives the round from there (last call, completion); only
  it reads the join records. Every other node waits on the round header alone (:class:`Wait`),
  even when it reads a count at ``min`` or above: ``N`` joins cost ``O(N)`` reads and wake-ups,
  not ``O(N^2)``. Should the driver die before completing, the others take over at their next
  periodic check (every ``heartbeat_interval``), which reads the records.
* A node arriving while round ``r`` is complete writes ``join/<r+1>/<node>`` and waits (the wait
  list); members see it through :func:`nodes_waiting`.
* A member that wants a new round (restart, scale-up, a dead peer, a node restarted under the
  same id) compare-and-sets the header to "round ``r+1`` open".
* Liveness: each node watches the heartbeat records of its two successors in the ring of
  members. A peer whose record has not changed for ``heartbeat_timeout`` of the observer's own
  monotonic time is dead (:class:`LivenessTracker`); no two hosts' clocks are ever compared.
  Observations start afresh with each attempt and each completed round: a record's value from
  an earlier round may be the last beat of a node since restarted under the same id.
* Closing sets ``closed`` in the header: the job is over for everyone (a node that merely leaves
  does not close the rendezvous).

This module holds the machine; the records and keys it reads and writes are in
:mod:`rallypoint.rendezvous.keyspace`, its inputs and actions in :mod:`rallypoint.rendezvous.actions`,
liveness in :mod:`rallypoint.rendezvous.membership`, what members make of nodes waiting (scale-up or hot
spares) in :mod:`rallypoint.rendezvous.spares`. Every one of those names is
also importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rallypoint.rendezvous.actions import (
    Action,
    CasHeader,
    Closed,
    Finished,
    NeedHeartbeats,
    NeedJoins,
    RemoveJoins,
    Settings,
    TimedOut,
    View,
    Wait,
    WriteJoin,
)
from rallypoint.rendezvous.errors import TimeoutInfo
from rallypoint.rendezvous.keyspace import (
    CLOSED_KEY,
    FORMAT,
    HEADER_KEY,
    JOB_KEY,
    ROUND_PREFIX,
    TICKET_KEY,
    Header,
    JoinRecord,
    Member,
    NodeInfo,
    count_key,
    heartbeat_key,
    join_key,
    join_prefix,
)
from rallypoint.rendezvous.membership import (
    LivenessTracker,
    Unreadable,
    heartbeat_problem,
    ring_successors,
)
from rallypoint.rendezvous.spares import nodes_waiting

__all__ = [
    "CLOSED_KEY",
    "FORMAT",
    "HEADER_KEY",
    "JOB_KEY",
    "ROUND_PREFIX",
    "TICKET_KEY",
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
        self._written: dict[int, int] = {}  # round -> the join count our record brought (0: unknown)
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
        self.liveness.clear()  # observations of the running round say nothing of this attempt's joiners

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

    def joined(self, round_: int, count: int = 0) -> None:
        """The handler wrote our join record for ``round_``; ``count``: the join counter our add returned.

        The node whose add brought the counter to ``min_nodes`` or ``max_nodes`` drives the round
        (last call, completion); ``0`` (the record replaced an earlier one, not counted again)
        makes this node a waiter.
        """
        self._written[round_] = count

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
                corrupt = self._fail_on_corrupt(view, watched)
                if corrupt is not None:
                    return corrupt
                dead = self._dead(watched, view.heartbeats, now)
                if dead:
                    return CasHeader(view.header_version, Header(round=h.round + 1, reason=_no_heartbeat(dead)))
            return Wait(min(self.join_deadline, self._next_check))

        # The round is open.
        r = h.round
        if r not in self._written:
            return WriteJoin(r, self.record_for(r))
        check_due = now >= self._next_check
        if not check_due and now < self.join_deadline:
            if view.count < s.min_nodes:
                self._min_seen_at.pop(r, None)
                return Wait(min(self.join_deadline, self._next_check))
            if r not in self._min_seen_at and self._written[r] not in (s.min_nodes, s.max_nodes):
                # Another node's join brought the count to min or max: it drives the round.
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
            corrupt = self._fail_on_corrupt(view, watched)
            if corrupt is not None:
                return corrupt
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

    def _fail_on_corrupt(self, view: View, watched: Sequence[str]) -> CasHeader | None:
        """The write that closes the job as failed when a watched heartbeat record is not one, else ``None``.

        Only rallypoint writes heartbeat records, and always well formed: a corrupt one means the
        run's state was written from outside. Waiting it out would take ``heartbeat_timeout`` (or,
        for the nodes left behind, the whole join timeout); every node stops now, told which one.
        """
        heartbeats = view.heartbeats or {}
        for node in watched:
            value = heartbeats.get(node)
            problem = heartbeat_problem(value)
            if problem is not None:
                reason = f"the heartbeat record of node {node!r} ({heartbeat_key(node)}) is corrupt: {problem}"
                if not isinstance(value, Unreadable):  # the backend's own message says what to do
                    reason += "; it was written from outside rallypoint: start the job again with a new run_id"
                return self.close_header(view, reason, failed=True)
        return None

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
        return CasHeader(view.header_version, header, tuple(members))

    def _finish(self, header: Header, rank: int) -> Finished:
        self.last_round = header.round
        self.last_rank = rank
        self.last_header = header
        self.join_deadline = float("inf")
        self.liveness.clear()  # a member may be a new incarnation whose first beat is still to come
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
        """The members whose heartbeats this node checks while ``header``'s round runs.

        A header resolved from this node's seat names them (:attr:`Header.ring`); otherwise they
        are this node's successors in the ring of the participants.
        """
        if header.ring is not None:
            return header.ring
        return ring_successors(header.member_ids(), self.node_id)

    def check_peers(self, view: View, now: float) -> CasHeader | None:
        """Check the watched members' heartbeats in a running round.

        ``view.heartbeats`` must hold the values of :meth:`watched_peers`. Returns the header
        write that opens the next round when one of them is dead, the write that closes the
        job as failed when a record is corrupt, else ``None``.
        """
        h = view.header
        if h.closed or not h.complete or self.last_round != h.round or view.heartbeats is None:
            return None
        corrupt = self._fail_on_corrupt(view, self.watched_peers(h))
        if corrupt is not None:
            return corrupt
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

    def close_header(self, view: View, reason: str = "", *, failed: bool = False) -> CasHeader | None:
        """The header write that closes the rendezvous (``None`` when already closed).

        Args:
            view: what the node read.
            reason: why the job ends (kept in the header for every node and for ``rallypoint status``).
            failed: the job failed for good; members stop their workers and report the failure.
        """
        if view.header.closed:
            return None
        header = replace(view.header, closed=True, failed=failed, reason=reason or view.header.reason)
        return CasHeader(view.header_version, header)
