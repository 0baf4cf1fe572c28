"""What a round costs: O(N) backend work for N nodes, a header whose size does not grow with N.

Every node of a round must learn the whole membership, but it reads it in one roster record
(fetched once per process), not one join record per member; only the node that completes the
round reads the join records, and the round header stays a few hundred bytes.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from typing import Any

import pytest

from rallypoint.rendezvous.backend import Entry
from rallypoint.rendezvous.errors import RendezvousStateError
from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult
from rallypoint.rendezvous.keyspace import HEADER_KEY, Header, JoinRecord, roster_key
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.roster import ROSTERS, RosterCache, encode_roster
from rallypoint.rendezvous.round_io import INLINE_ROSTER, read_header
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

# Periodic checks and heartbeats far away: the round must complete through its own wake-ups.
QUIET = RendezvousTimeouts(join=60, last_call=30, close=5, heartbeat_interval=30, heartbeat_timeout=60)


class CountingBackend(MemoryBackend):
    """A memory backend that counts calls and the records each ``list``/``get`` returns."""

    def __init__(self, run_id: str, counts: Counter[str]) -> None:
        super().__init__(run_id)
        self.counts = counts
        self._lock = threading.Lock()

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def list(self, prefix: str) -> dict[str, Entry]:
        out = super().list(prefix)
        self._count("calls")
        self._count("join records listed" if prefix.startswith("join/") else "other records listed", len(out))
        return out

    def get(self, key: str) -> Entry | None:
        self._count("calls")
        if key.startswith("roster/"):
            self._count("roster reads")
        return super().get(key)

    def set(self, key: str, value: Any, *, ttl: float | None = None) -> int:
        self._count("calls")
        return super().set(key, value, ttl=ttl)

    def compare_and_set(self, key: str, value: Any, *, version: Any, ttl: float | None = None) -> Any:
        self._count("calls")
        return super().compare_and_set(key, value, version=version, ttl=ttl)

    def add(self, key: str, amount: int = 1) -> int:
        self._count("calls")
        return super().add(key, amount)


def _round(n: int, counts: Counter[str], *, check: Any = None) -> list[RendezvousResult]:
    """One round of ``n`` handlers in threads; ``check(results)`` runs before they leave."""
    run_id = f"cost-{uuid.uuid4().hex[:8]}"
    handlers = [
        RendezvousHandler(CountingBackend(run_id, counts), make_node(i), min_nodes=n, max_nodes=n, timeouts=QUIET)
        for i in range(n)
    ]
    results: list[RendezvousResult] = []
    threads = [threading.Thread(target=lambda h=h: results.append(h.next_rendezvous())) for h in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == n
    if check is not None:
        check(results)
    for h in handlers:
        h.shutdown()
    return results


def test_a_round_of_n_nodes_reads_each_join_record_about_once() -> None:
    ROSTERS.clear()
    n = 48
    counts: Counter[str] = Counter()
    results = _round(n, counts)
    assert sorted(r.group_rank for r in results) == list(range(n))
    assert len({tuple(p.node_id for p in r.participants) for r in results}) == 1, "members disagree"
    # Before the roster every node listed every join record (N^2 = 2304 here) to build its result.
    assert counts["join records listed"] <= 3 * n, counts
    assert counts["roster reads"] <= 2, counts  # one process: fetched once (a race may add one)
    assert counts["calls"] <= 12 * n, counts


def test_the_header_does_not_grow_with_the_job() -> None:
    def check(results: list[RendezvousResult]) -> None:
        backend = MemoryBackend(results[0].run_id)
        raw = backend.get(HEADER_KEY)
        assert raw is not None
        assert len(json.dumps(raw.value)) < 400, raw.value
        header, _ = read_header(backend)
        assert header.complete
        assert header.member_ids() == [p.node_id for p in results[0].participants]
        for rank, member in enumerate(header.participants):
            assert header.rank_of(member.node_id, member.incarnation) == rank

    _round(40, Counter(), check=check)


def _records(n: int) -> list[JoinRecord]:
    return [JoinRecord(make_node(i), f"inc{i}", i) for i in range(n)]


def test_a_roster_is_fetched_once_by_concurrent_readers() -> None:
    backend = CountingBackend(f"roster-{uuid.uuid4().hex[:8]}", Counter())
    digest, value = encode_roster(3, _records(5))
    backend.set(roster_key(3, digest), value)
    cache = RosterCache()
    got: list[Any] = []
    barrier = threading.Barrier(16)

    def read() -> None:
        barrier.wait()
        got.append(cache.get(backend, 3, digest))

    threads = [threading.Thread(target=read) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 16
    assert all(r is got[0] for r in got)
    assert got[0].members[2].node_id == "node2"
    assert got[0].index[("node4", "inc4")] == 4
    assert backend.counts["roster reads"] == 1


def test_a_roster_that_does_not_match_its_digest_is_refused() -> None:
    backend = MemoryBackend(f"roster-{uuid.uuid4().hex[:8]}")
    digest, value = encode_roster(0, _records(3))
    value["members"][0]["node"]["addr"] = "10.9.9.9"  # rewritten behind the header's back
    backend.set(roster_key(0, digest), value)
    with pytest.raises(RendezvousStateError, match="digest"):
        RosterCache().get(backend, 0, digest)
    assert RosterCache().get(backend, 1, digest) is None  # another round's key: absent


class RecordingBackend(CountingBackend):
    """A counting backend that also keeps the order of its calls as ``(operation, key)``."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id, Counter())
        self.calls: list[tuple[str, str]] = []

    def list(self, prefix: str) -> dict[str, Entry]:
        self.calls.append(("list", prefix))
        return super().list(prefix)

    def get(self, key: str) -> Entry | None:
        self.calls.append(("get", key))
        return super().get(key)

    def compare_and_set(self, key: str, value: Any, *, version: Any, ttl: float | None = None) -> Any:
        self.calls.append(("compare_and_set", key))
        return super().compare_and_set(key, value, version=version, ttl=ttl)


def test_the_node_that_completes_a_round_reads_nothing_after_its_header_write() -> None:
    """Its next step used to read the header it had just written, and then the roster it had just
    written: two more round trips (about 2 ms on etcd) on the path of every rendezvous."""
    ROSTERS.clear()
    backend = RecordingBackend(f"done-{uuid.uuid4().hex[:8]}")
    handler = RendezvousHandler(backend, make_node(0), min_nodes=1, max_nodes=1, timeouts=QUIET)
    try:
        result = handler.next_rendezvous()
        calls = list(backend.calls)  # not what the shutdown does
    finally:
        handler.shutdown()
    assert result.group_rank == 0
    assert result.participants[0].node_id == "node0"
    writes = [i for i, call in enumerate(calls) if call == ("compare_and_set", HEADER_KEY)]
    assert writes, calls
    assert calls[writes[-1] + 1 :] == [], calls
    assert backend.counts["roster reads"] == 0, calls


def test_the_completing_write_carries_the_roster_and_the_header_is_slimmed_at_once() -> None:
    ROSTERS.clear()
    writes: list[Any] = []

    class Recording(MemoryBackend):
        wait_with = None  # type: ignore[assignment]  # as etcd's and the file backend: no seat with a change

        def compare_and_set(self, key: str, value: Any, *, version: Any, ttl: float | None = None) -> Any:
            if key == HEADER_KEY:
                writes.append(value)
            return super().compare_and_set(key, value, version=version, ttl=ttl)

    run_id = f"inline-{uuid.uuid4().hex[:8]}"
    handler = RendezvousHandler(Recording(run_id), make_node(0), min_nodes=1, max_nodes=1, timeouts=QUIET)
    try:
        handler.next_rendezvous()
    finally:
        handler.shutdown()
    complete = [w for w in writes if w["complete"]]
    assert len(complete) == 2, writes
    assert complete[0][INLINE_ROSTER]["members"][0]["node"]["id"] == "node0"
    assert INLINE_ROSTER not in complete[1]
    assert {k: v for k, v in complete[0].items() if k != INLINE_ROSTER} == complete[1]


def test_a_header_carrying_its_roster_fills_the_cache_and_a_forged_one_is_refused() -> None:
    ROSTERS.clear()
    backend = CountingBackend(f"inline-{uuid.uuid4().hex[:8]}", Counter())
    digest, value = encode_roster(0, _records(3))
    header = {**Header(round=0, complete=True, roster=digest).to_json(), INLINE_ROSTER: value}
    backend.set(HEADER_KEY, header)
    got, _ = read_header(backend)
    assert [m.node_id for m in got.participants] == ["node0", "node1", "node2"]
    assert backend.counts["roster reads"] == 0  # the roster record itself was never written
    ROSTERS.clear()
    value["members"][0]["node"]["addr"] = "10.9.9.9"
    backend.set(HEADER_KEY, header)
    with pytest.raises(RendezvousStateError, match="digest"):
        read_header(backend)
