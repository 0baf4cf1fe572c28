"""The I/O of the rendezvous algorithm: state-machine actions carried out against a backend.

:class:`RoundIO` reads what :class:`~rallypoint.rendezvous.state.RendezvousStateMachine` needs
(header, join counter, join records, heartbeats) and applies the writes it asks for. The handler
and the property tests both use it, so both run exactly the same protocol. A completed round is
turned into a :class:`RendezvousResult` from this node's seat (:mod:`rallypoint.rendezvous.seats`):
one small record per member, which a backend that can (:class:`~rallypoint.rendezvous.backend.SupportsWaitWith`)
sends with the header change that wakes the member. A member without a valid seat (a header
written before seats, a stale seat) reads the round's roster record
(:mod:`rallypoint.rendezvous.roster`) instead: one read per process.
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import replace
from typing import Any

from rallypoint.rendezvous.backend import (
    Entry,
    HeldWatch,
    JSONValue,
    RendezvousBackend,
    SupportsHeldWatch,
    SupportsWaitWith,
    Version,
    WatchedChange,
    check_in,
    create_and_add,
    set_many,
)
from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError
from rallypoint.rendezvous.keyspace import roster_key, roster_prefix, seat_key
from rallypoint.rendezvous.membership import Unreadable, heartbeat_record
from rallypoint.rendezvous.result import RendezvousResult, WorkerStoreInfo
from rallypoint.rendezvous.roster import ROSTERS, Roster, encode_roster
from rallypoint.rendezvous.seats import Assign, Seat, encode_seats
from rallypoint.rendezvous.state import (
    CLOSED_KEY,
    HEADER_KEY,
    ROUND_PREFIX,
    TICKET_KEY,
    Action,
    CasHeader,
    Finished,
    Header,
    JoinRecord,
    NeedHeartbeats,
    NeedJoins,
    NodeInfo,
    RemoveJoins,
    RendezvousStateMachine,
    TimedOut,
    View,
    WriteJoin,
    count_key,
    heartbeat_key,
    join_key,
    join_prefix,
)

__all__ = ["KEEP_ROUNDS", "RendezvousResult", "RoundIO", "WorkerStoreInfo", "free_port", "read_header", "resolve"]

log = logging.getLogger("rallypoint.rendezvous")

#: Rounds older than ``round - KEEP_ROUNDS`` are garbage-collected when a round opens.
KEEP_ROUNDS = 2
#: A seat not given by the caller: read it if needed.
_UNREAD: Any = object()


def free_port(host: str = "") -> int:
    """A TCP port that was free a moment ago (bind to port 0, then release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


#: The field of a complete header's JSON that carries its roster record, in the one write that
#: completes the round, for a backend that cannot send a member its seat with the change it waits
#: for (no :class:`~rallypoint.rendezvous.backend.SupportsWaitWith`): the nodes woken by that write
#: (their watch's event holds it) need no read at all. The writer rewrites the header without it
#: at once, so that the reads of a running round (every agent checks the header every
#: ``monitor_interval``) stay small. A backend that sends seats never gets it: each member receives
#: its own seat (:mod:`rallypoint.rendezvous.seats`), a few hundred bytes whatever the job's size.
INLINE_ROSTER = "inline_roster"
#: The largest roster record (JSON text) carried in the header: about 300 nodes. Above it the
#: members read their seat (one small read each).
INLINE_ROSTER_BYTES = 64 * 1024


def _small(value: dict[str, Any]) -> bool:
    return len(json.dumps(value, separators=(",", ":"))) <= INLINE_ROSTER_BYTES


def _header(value: Any) -> Header:
    """Parse a stored header; a roster record it carries goes to the roster cache (checked against its digest)."""
    header = Header.from_json(value)
    if header.roster and isinstance(value, dict) and INLINE_ROSTER in value and not ROSTERS.known(header.roster):
        ROSTERS.remember(Roster.parse(header.round, header.roster, value[INLINE_ROSTER]))
    return header


def _heartbeat_value(entry: Entry | None) -> Any:
    return None if entry is None else entry.value


def _roster(backend: RendezvousBackend, header: Header) -> Roster:
    roster = ROSTERS.get(backend, header.round, header.roster)
    if roster is None:
        raise RendezvousStateError(
            f"rendezvous round {header.round} names the roster {roster_key(header.round, header.roster)!r}, "
            "which is missing (removed by hand, or the round is long past)"
        )
    return roster


def resolve(backend: RendezvousBackend, header: Header) -> Header:
    """``header`` with its participants (and their rank index) read from its roster record.

    A header that holds no roster reference is returned as it is.

    Raises:
        RendezvousStateError: the roster record is missing, malformed or does not match.
    """
    if not header.roster:
        return header
    roster = _roster(backend, header)
    return replace(header, participants=roster.members, index=roster.index)


def read_header(backend: RendezvousBackend) -> tuple[Header, Version | None]:
    """The round header with its participants resolved (``Header()`` when none yet), and its version."""
    entry = backend.get(HEADER_KEY)
    if entry is None:
        return Header(), None
    return resolve(backend, _header(entry.value)), entry.version


class RoundIO:
    """Executes state-machine actions against a backend (the only I/O of the algorithm).

    Shared by the handler and the tests, so both run exactly the same protocol.

    Args:
        backend: the key-value space.
        machine: this node's state machine.
        assign: the assignment function the node that completes a round runs once for every
            member (see :mod:`rallypoint.rendezvous.seats`); ``None``: none.
    """

    def __init__(
        self, backend: RendezvousBackend, machine: RendezvousStateMachine, assign: Assign | None = None
    ) -> None:
        self.backend = backend
        self.machine = machine
        self.assign = assign
        self._hb_seq = 0
        self._joined_count = 0
        self._completed: tuple[Header, Version] | None = None  # the header of the round this node completed
        self._seat: Seat | None = None  # this node's last seat
        self._seatless: tuple[int, str] | None = None  # (round, roster) this node found no seat of its own for

    # -- reads ---------------------------------------------------------------------------
    def read(self) -> View:
        """Read the header and the join counter (one prefix list)."""
        return self._view(self.backend.list(ROUND_PREFIX))

    def check_in(self, claim: tuple[str, JSONValue] | None = None) -> tuple[View, Entry | None]:
        """A node's first read, taking its arrival ticket in the same step (where the backend can).

        No ticket is taken once the run is being closed (:data:`CLOSED_KEY` exists) or, with
        ``claim`` (the job key and this node's fingerprint), when another job claimed the run
        id; :meth:`ensure_ticket` takes it later where the check-in took none.

        Returns:
            the view read, and the claim key's entry (see :class:`~rallypoint.rendezvous.backend.CheckIn`).
        """
        done = check_in(self.backend, ROUND_PREFIX, TICKET_KEY, unless=CLOSED_KEY, claim=claim)
        if done.count is not None and self.machine.ticket is None:
            self.machine.set_ticket(done.count)
        return self._view(done.entries), done.claimed

    def _view(self, entries: dict[str, Entry]) -> View:
        """The view of a listing of the round keys: the header (resolved) and its join counter."""
        raw = entries.get(HEADER_KEY)
        header = Header() if raw is None else self._resolve(_header(raw.value))
        count = entries.get(count_key(header.round))
        value = 0 if count is None else count.value
        if not isinstance(value, int):
            raise RendezvousStateError(f"malformed rendezvous join counter {count_key(header.round)!r}: {value!r}")
        return View(header, None if raw is None else raw.version, value)

    def _resolve(self, header: Header, seat: Entry | None = _UNREAD) -> Header:
        """``header`` resolved for this node: from its seat where it has a valid one, else from the roster.

        A header resolved from the seat knows this node's rank only (and the peers it watches);
        ``seat``: the seat's entry when the caller has it (``None``: absent), else it is read
        (once per round: a node without a seat of its own does not look again).
        """
        if header.seats and header.roster and header.complete:
            found = self._seat_for(header, seat)
            if found is not None:
                me = (self.machine.node_id, self.machine.incarnation)
                return replace(header, index={me: found.rank}, ring=found.ring)
        return resolve(self.backend, header)

    def _seat_for(self, header: Header, given: Entry | None) -> Seat | None:
        inc = self.machine.incarnation
        if self._seat is not None and self._seat.fits(header, inc):
            return self._seat
        key = (header.round, header.roster)
        if given is _UNREAD:
            if self._seatless == key:
                return None  # none for this node: the roster serves
            given = self.backend.get(seat_key(self.machine.node_id))
        try:
            seat = None if given is None else Seat.from_json(given.value)
        except RendezvousStateError as exc:  # the roster serves; a corrupt roster fails the node there
            log.debug("node %r: %s", self.machine.node_id, exc)
            seat = None
        if seat is None or not seat.fits(header, inc):
            self._seatless = key
            return None
        self._seat = seat
        return seat

    def _seat_only(self, header: Header | None) -> bool:
        """Whether ``header`` was resolved from a seat (it knows this node's rank, not the members)."""
        return header is not None and bool(header.roster) and header.ring is not None and not header.participants

    def _full_header(self, header: Header) -> Header:
        """``header`` with every participant read from its roster (without them when the roster is gone)."""
        try:
            return resolve(self.backend, replace(header, index=None, ring=None))
        except RendezvousStateError:
            return replace(header, ring=None)

    def read_joins(self, round_: int) -> dict[str, JoinRecord]:
        """The join records of ``round_``, by node id."""
        prefix = join_prefix(round_)
        out = {}
        for key, entry in self.backend.list(prefix).items():
            record = JoinRecord.from_json(entry.value)
            if key[len(prefix) :] != record.node.node_id:
                raise RendezvousStateError(f"rendezvous join record {key!r} names node {record.node.node_id!r}")
            out[record.node.node_id] = record
        return out

    def read_heartbeats(self, ids: tuple[str, ...]) -> dict[str, Any]:
        """The heartbeat values of ``ids`` (``None`` when absent).

        A record the backend cannot read (a file that is not JSON, a value that does not decode)
        is :class:`~rallypoint.rendezvous.membership.Unreadable`: the state machine names its
        node and fails the round, instead of this read failing the reader's own heartbeat.
        """
        out: dict[str, Any] = {}
        for i in ids:
            try:
                out[i] = _heartbeat_value(self.backend.get(heartbeat_key(i)))
            except (RendezvousStateError, ValueError) as exc:
                out[i] = Unreadable(str(exc))
        return out

    def decide(self, now: float, view: View | None = None) -> tuple[Action, View]:
        """Read what the machine needs and return its action (not yet applied).

        ``view``: what the caller knows already (see :meth:`view_after`); ``None`` reads afresh.
        """
        view = self.read() if view is None else view
        for _ in range(4):
            action = self.machine.step(view, now)
            if isinstance(action, NeedJoins):
                view = replace(view, joins=self.read_joins(view.header.round))
            elif isinstance(action, NeedHeartbeats):
                view = replace(view, heartbeats=self.read_heartbeats(action.node_ids))
            elif isinstance(action, TimedOut) and self._seat_only(self.machine.last_header):
                # the timeout names the last round's members that are missing: read them now
                self.machine.last_header = self._full_header(self.machine.last_header)  # type: ignore[arg-type]
            else:
                return action, view
        raise AssertionError("rendezvous state machine asked for data repeatedly")  # pragma: no cover

    # -- waits ---------------------------------------------------------------------------
    def hold_header_watch(self, timeout: float) -> HeldWatch | None:
        """A watch on the round header, in place before an attempt's first read (where the backend can hold one).

        The attempt's first wait (a node's join is followed by one) then needs no read to learn
        whether the header changed since the node's last read: the watch saw every change since
        before it. ``timeout``: its deadline (the first liveness check, which ends that wait anyway).
        """
        if not isinstance(self.backend, SupportsHeldWatch):
            return None
        try:
            return self.backend.hold_watch(HEADER_KEY, timeout=timeout)
        except RendezvousBackendError as exc:  # the plain watch serves; a backend that is down fails the read
            log.debug("node %r: no held watch on the round header (%s)", self.machine.node_id, exc)
            return None

    def wait_held(self, held: HeldWatch, view: View, timeout: float) -> View | None:
        """Wait up to ``timeout`` for the header on ``held`` (then closed); the view its change gives, if any.

        A held watch ends at its own deadline: when the wait must end sooner (a last call), it
        waits with a plain watch instead. A broken watch counts as a change: the next step reads.
        A backend that sends this node's seat with the change waits with that instead (see
        :meth:`wait_header`): it compares the version itself, so nothing is missed either.
        """
        try:
            if timeout <= 0:
                return None
            if held.remaining() > timeout or isinstance(self.backend, SupportsWaitWith):
                return self.wait_header(view, timeout)
            try:
                change = held.wait(view.header_version)
            except RendezvousBackendError as exc:
                log.debug("node %r: the held watch on the round header broke (%s)", self.machine.node_id, exc)
                return None
        finally:
            held.close()
        return self._view_of_change(change)

    def wait_header(self, view: View, timeout: float) -> View | None:
        """Wait up to ``timeout`` for the header to leave ``view``'s version; the view its change gives, if any.

        Where the backend can (:class:`~rallypoint.rendezvous.backend.SupportsWaitWith`), this
        node's seat comes with the change: a member learns the completed round from that one
        message. Otherwise a plain watch, and the next step reads.
        """
        if timeout <= 0:
            return None
        if not isinstance(self.backend, SupportsWaitWith):
            self.backend.watch(HEADER_KEY, version=view.header_version, timeout=min(timeout, 3600.0))
            return None
        mine = seat_key(self.machine.node_id)
        change = self.backend.wait_with(
            HEADER_KEY, version=view.header_version, timeout=min(timeout, 3600.0), also=(mine,)
        )
        return self._view_of_change(change, mine)

    def _view_of_change(self, change: WatchedChange | None, seat: str = "") -> View | None:
        if change is None:
            return None
        return self.view_of_header(change.entry, change.also.get(seat, _UNREAD))

    def view_of_header(self, entry: Entry | None, seat: Entry | None = _UNREAD) -> View | None:
        """The view a watched change of the header gives without a read, or ``None`` (read).

        Only a complete or closed header stands on its own: the next step of a member finishes
        (or stops) from it, and nobody looks at the join counter of such a round. Of an open
        header, the step needs the counter too; of a deleted one, nothing is known. ``seat``:
        this node's seat entry when it came with the change.
        """
        if entry is None:
            return None
        header = _header(entry.value)
        if not (header.complete or header.closed):
            return None
        return View(self._resolve(header, seat), entry.version, 0)

    # -- writes --------------------------------------------------------------------------
    def heartbeat(self) -> None:
        """Rewrite this node's own heartbeat record (the only key a heartbeat touches)."""
        self._hb_seq += 1
        self.backend.set(heartbeat_key(self.machine.node_id), heartbeat_record(self.machine.incarnation, self._hb_seq))

    def ensure_ticket(self) -> None:
        """Take an arrival ticket once per incarnation."""
        if self.machine.ticket is None:
            self.machine.set_ticket(self.backend.add(TICKET_KEY, 1))

    def apply(self, action: Action) -> bool:
        """Carry out a write action; returns False when a compare-and-set lost a race."""
        b = self.backend
        if isinstance(action, WriteJoin):
            key = join_key(action.round, self.machine.node_id)
            written, _, count = create_and_add(b, key, action.record.to_json(), count_key(action.round), 1)
            if not written:  # a record of an earlier incarnation (or attempt): replace it, already counted
                b.set(key, action.record.to_json())
                entry = b.get(count_key(action.round))  # drive the round if the count stands at min or max
                count = entry.value if entry is not None and isinstance(entry.value, int) else 0
            self.machine.joined(action.round, count)
            self._joined_count = count
            return True
        if isinstance(action, RemoveJoins):
            for node_id in action.node_ids:
                if b.delete(join_key(action.round, node_id)):
                    b.add(count_key(action.round), -1)
            return True
        if isinstance(action, CasHeader):
            self._completed = None  # only this write's outcome may serve as the next view
            header, record = action.header, None
            if action.roster:  # the membership and the seats go first; the header names them
                header, record = self._publish_members(header, action.roster)
            data = header.to_json()
            inline = record is not None and header.complete and not header.closed and not header.seats
            if inline:  # the members come with the write that wakes them (see INLINE_ROSTER_BYTES)
                data[INLINE_ROSTER] = record
            ok, stored = b.compare_and_set(HEADER_KEY, data, version=action.expected)
            if ok and inline and stored is not None:  # then slim again: later reads stay small
                slim, again = b.compare_and_set(HEADER_KEY, header.to_json(), version=stored.version)
                stored = again if slim else stored
            if ok and stored is not None and header.complete and not header.closed:
                self._completed = (header, stored.version)
            if ok and not action.header.complete and not action.header.closed:
                self._collect_garbage(action.header.round - KEEP_ROUNDS - 1)
            return ok
        return True

    def _publish_members(self, header: Header, members: tuple[JoinRecord, ...]) -> tuple[Header, dict[str, Any]]:
        """Write a completing round's roster and its seats (:mod:`~rallypoint.rendezvous.seats`); return the header.

        Seats go where a member receives its own with the header change (the backend sends
        keys with a change), or where the roster is too big to travel in the header; otherwise
        the header carries the roster (one read less per member, nothing per member to write).
        """
        b = self.backend
        digest, record = encode_roster(header.round, members)
        items: dict[str, Any] = {roster_key(header.round, digest): record}
        seats = isinstance(b, SupportsWaitWith) or not _small(record)
        if seats:
            placed = encode_seats(header.round, digest, members, self.assign)
            items.update((key, seat.to_json()) for key, seat in placed.items())
            mine = placed.get(seat_key(self.machine.node_id))
            self._seat = mine if mine is not None and mine.incarnation == self.machine.incarnation else None
        set_many(b, items)
        ROSTERS.remember(Roster.parse(header.round, digest, record))
        return replace(header, roster=digest, seats=seats, size=len(members)), record

    def view_after(self, action: Action, view: View) -> View | None:
        """What the next step can use instead of reading again after ``action`` was applied, or ``None``.

        After a join the round header is what ``view`` read (the join did not touch it), and the
        join counter is what our own add returned: the next step needs no read. If the header
        changed meanwhile, the :class:`~rallypoint.rendezvous.state.Wait` that follows watches it
        from ``view``'s version and returns at once. Saves one read per node and join.

        After this node completed the round (its compare-and-set of the complete header
        succeeded), the header is the one it wrote, at the version the write returned, and its
        roster is the one it wrote: the node that completes a round reads nothing more.
        """
        if isinstance(action, CasHeader):
            completed, self._completed = self._completed, None
            if completed is None:
                return None
            header, version = completed
            return View(self._resolve(header), version, view.count)
        if not isinstance(action, WriteJoin):
            return None
        count = self._joined_count if action.round == view.header.round else view.count
        return replace(view, count=max(count, view.count), joins=None, heartbeats=None)

    def withdraw(self) -> None:
        """Remove this incarnation's join records from open rounds (after a timeout, or when leaving)."""
        b = self.backend
        me = self.machine.node_id
        h = self.read().header
        for r in (h.round, h.round + 1):
            entry = b.get(join_key(r, me))
            if (
                entry is not None
                and isinstance(entry.value, dict)
                and entry.value.get("inc") == self.machine.incarnation
                and not (h.complete and r == h.round)
                and b.delete(join_key(r, me), version=entry.version)
            ):
                b.add(count_key(r), -1)
        self.machine.forget_joins()

    def _collect_garbage(self, round_: int) -> None:
        if round_ < 0:
            return
        for prefix in (join_prefix(round_), roster_prefix(round_)):
            for key in self.backend.list(prefix):
                self.backend.delete(key)
        self.backend.delete(count_key(round_))

    def result(self, finished: Finished) -> RendezvousResult:
        """The result of a finished round: from this node's seat, else from the roster (or, format 1, the join records).

        From the seat, the participants are read from the roster only when asked for.
        """
        h = finished.header
        backend = self.backend

        def members() -> tuple[NodeInfo, ...]:
            return _roster(backend, h).nodes if h.roster else tuple(self._members_from_joins(h))

        seat = self._seat
        if seat is not None and seat.fits(h, self.machine.incarnation):
            store = WorkerStoreInfo(*seat.store)
            node = self.machine.node
            return RendezvousResult(
                backend.run_id, h.round, finished.rank, seat.size, store, node, seat.assigned, h.roster, members
            )
        everyone = members()
        first = everyone[0]
        return RendezvousResult(
            run_id=backend.run_id,
            round=h.round,
            group_rank=finished.rank,
            num_nodes=len(everyone),
            store=WorkerStoreInfo(first.addr, first.master_port if first.master_port is not None else 0),
            node=everyone[finished.rank],
            roster=h.roster,
            members=lambda: everyone,
        )

    def _members_from_joins(self, h: Header) -> list[NodeInfo]:
        """The participants' records of a header with inline participants (format 1)."""
        joins = self.read_joins(h.round)
        members = []
        for m in h.participants:
            record = joins.get(m.node_id)
            if record is None or record.incarnation != m.incarnation:
                raise RendezvousStateError(
                    f"rendezvous round {h.round} lists node {m.node_id!r} but its join record "
                    f"join/{h.round}/{m.node_id} is missing or from another incarnation"
                )
            members.append(record.node)
        return members
