"""Seats (#38): each member receives one small record of its own, not the whole roster.

Before seats, every member of a round received the roster (about 200 bytes per member: 43 kB per
node at 256 nodes on gRPC, O(N^2) for the round); each member now receives its seat, whose size
does not depend on the job's size, with the header change that wakes it.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from rallypoint.rendezvous.backend import Entry, Version, WatchedChange
from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult
from rallypoint.rendezvous.keyspace import HEADER_KEY, Header, NodeInfo, seat_key
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.roster import ROSTERS
from rallypoint.rendezvous.seats import Seat, encode_seats
from rallypoint.rendezvous.state import JoinRecord
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

QUIET = RendezvousTimeouts(join=60, last_call=30, close=5, heartbeat_interval=30, heartbeat_timeout=60)


class Recording(MemoryBackend):
    """A memory backend recording its calls as ``(operation, key)`` (shared list per run)."""

    def __init__(self, run_id: str, calls: list[tuple[str, str, str]], name: str) -> None:
        super().__init__(run_id)
        self.calls, self.name = calls, name

    def get(self, key: str) -> Entry | None:
        self.calls.append((self.name, "get", key))
        return super().get(key)

    def list(self, prefix: str) -> dict[str, Entry]:
        self.calls.append((self.name, "list", prefix))
        return super().list(prefix)

    def wait_with(self, key: str, *, version: Version | None, timeout: float, also: Sequence[str]) -> Any:
        self.calls.append((self.name, "wait_with", key))
        return super().wait_with(key, version=version, timeout=timeout, also=also)


def _round(n: int, backends: list[MemoryBackend], assign: Any = None) -> list[RendezvousResult]:
    handlers = [
        RendezvousHandler(b, make_node(i), min_nodes=n, max_nodes=n, timeouts=QUIET, assign=assign)
        for i, b in enumerate(backends)
    ]
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        results[i] = handlers[i].next_rendezvous()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for h in handlers:
            h.shutdown()
    assert all(isinstance(r, RendezvousResult) for r in results), results
    return results


def test_each_member_learns_its_round_from_its_seat_and_reads_no_roster() -> None:
    ROSTERS.clear()
    run_id = f"seats-{uuid.uuid4().hex[:8]}"
    calls: list[tuple[str, str, str]] = []
    n = 8
    results = _round(n, [Recording(run_id, calls, f"node{i}") for i in range(n)])
    assert sorted(r.group_rank for r in results) == list(range(n))
    assert {r.num_nodes for r in results} == {n}
    assert len({r.store for r in results}) == 1
    roster_reads = [c for c in calls if c[2].startswith("roster/")]
    assert roster_reads == [], roster_reads  # nobody read the roster: each had its seat
    # the participants are still there for whoever asks (read on demand, once per process)
    assert [p.node_id for p in results[0].participants] == [p.node_id for p in results[-1].participants]
    for r in results:
        assert r.participants[r.group_rank].node_id == r.node.node_id


def test_a_seat_does_not_grow_with_the_job() -> None:
    def seat_bytes(n: int) -> int:
        members = [
            JoinRecord(NodeInfo(f"node{i:05d}", f"host{i}", f"10.0.{i // 250}.{i % 250}", 8, {"rack": "r1"}), "inc", i)
            for i in range(n)
        ]
        seats = encode_seats(0, "d" * 32, members, lambda ms: [{"ranks": list(range(8))} for _ in ms])
        return max(len(json.dumps(s.to_json())) for s in seats.values())

    small, large = seat_bytes(4), seat_bytes(4096)
    assert large <= small + 8, (small, large)  # a few more digits in the ids, nothing per member
    assert large < 400


def test_a_stale_seat_is_never_taken() -> None:
    """A seat of another round, roster or incarnation (a node restarted under the same id, a lost
    race between two completing writes) does not fit the header: the member reads the roster."""
    header = Header(round=3, complete=True, roster="abc", seats=True, size=2)
    seat = Seat(round=3, roster="abc", incarnation="i1", rank=1, size=2, store=("h", 1), ring=("a",))
    assert seat.fits(header, "i1")
    assert not seat.fits(header, "i2")
    assert not seat.fits(Header(round=4, complete=True, roster="abc", seats=True, size=2), "i1")
    assert not seat.fits(Header(round=3, complete=True, roster="abd", seats=True, size=2), "i1")
    assert not seat.fits(Header(round=3, complete=True, roster="abc", seats=False, size=2), "i1")


class ForgedSeats(MemoryBackend):
    """Hands every waiting node a forged seat (rank 0 of another roster) with the change."""

    def wait_with(self, key: str, *, version: Version | None, timeout: float, also: Sequence[str]) -> Any:
        change = super().wait_with(key, version=version, timeout=timeout, also=also)
        if change is None:
            return None
        forged = Seat(round=0, roster="f" * 32, incarnation="x", rank=0, size=2, store=("evil", 1), ring=())
        return WatchedChange(change.entry, {k: Entry(forged.to_json(), 1) for k in also})


def test_a_forged_or_stale_seat_costs_a_read_not_a_wrong_rank() -> None:
    ROSTERS.clear()
    run_id = f"forged-{uuid.uuid4().hex[:8]}"
    results = _round(3, [ForgedSeats(run_id) for _ in range(3)])
    assert sorted(r.group_rank for r in results) == [0, 1, 2]
    assert {r.store.master_addr for r in results} != {"evil"}
    for r in results:
        assert r.participants[r.group_rank].node_id == r.node.node_id


def test_the_assignment_function_runs_once_and_each_member_gets_its_value() -> None:
    ROSTERS.clear()
    run_id = f"assign-{uuid.uuid4().hex[:8]}"
    calls: list[int] = []

    def assign(members: Sequence[NodeInfo]) -> list[dict[str, Any]]:
        calls.append(len(members))
        return [{"node": m.node_id, "ranks": [2 * i, 2 * i + 1]} for i, m in enumerate(members)]

    results = _round(4, [MemoryBackend(run_id) for _ in range(4)], assign)
    assert calls == [4]
    for r in results:
        assert r.assigned == {"node": r.node.node_id, "ranks": [2 * r.group_rank, 2 * r.group_rank + 1]}


def test_a_failing_assignment_function_leaves_each_member_to_compute() -> None:
    ROSTERS.clear()
    run_id = f"assign-fails-{uuid.uuid4().hex[:8]}"

    def assign(members: Sequence[NodeInfo]) -> list[Any]:
        raise ValueError("no ranks for these nodes")

    results = _round(2, [MemoryBackend(run_id) for _ in range(2)], assign)
    assert [r.assigned for r in results] == [None, None]
    assert sorted(r.group_rank for r in results) == [0, 1]


def test_a_running_member_checks_its_ring_from_its_seat() -> None:
    """Its heartbeat reads the header every interval; the peers it watches come from its seat."""
    ROSTERS.clear()
    run_id = f"ring-{uuid.uuid4().hex[:8]}"
    calls: list[tuple[str, str, str]] = []
    backends = [Recording(run_id, calls, f"node{i}") for i in range(4)]
    handlers = [
        RendezvousHandler(b, make_node(i), min_nodes=4, max_nodes=4, timeouts=QUIET) for i, b in enumerate(backends)
    ]
    threads = [threading.Thread(target=h.next_rendezvous) for h in handlers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        results = [h.last_result for h in handlers]
        assert all(r is not None for r in results)
        me = handlers[1]
        view = me.io.read()
        order = [h.node_id for h in sorted(handlers, key=lambda h: h.last_result.group_rank)]  # type: ignore[union-attr]
        i = order.index(me.node_id)
        assert me.machine.watched_peers(view.header) == (order[(i + 1) % 4], order[(i + 2) % 4])
        assert [c for c in calls if c[2].startswith("roster/")] == []
        assert backends[1].get(seat_key(me.node_id)) is not None
        assert backends[1].get(HEADER_KEY) is not None
    finally:
        for h in handlers:
            h.shutdown()
