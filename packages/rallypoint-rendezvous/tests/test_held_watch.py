"""The watch a handler holds on the round header from before its first read until its first wait.

On a backend that can hold one (:class:`~rallypoint.rendezvous.backend.SupportsHeldWatch`), a
node that joined and waits for the round reads nothing to find out whether the header changed
meanwhile, and nothing after the round completed: the change it was woken by is the complete
header. Each read saved is a round trip per node on a networked backend (64 nodes woken at once
on etcd read 64 times).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from rallypoint.rendezvous.backend import Entry, HeldWatch, SupportsHeldWatch, Version, WatchedChange
from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult
from rallypoint.rendezvous.keyspace import HEADER_KEY
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.roster import ROSTERS
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

QUIET = RendezvousTimeouts(join=60, last_call=30, close=5, heartbeat_interval=30, heartbeat_timeout=60)


class _Held:
    def __init__(self, backend: HoldingBackend, key: str, timeout: float) -> None:
        self.backend = backend
        self.key = key
        self.until = time.monotonic() + timeout
        self.closed = False

    def remaining(self) -> float:
        return max(0.0, self.until - time.monotonic())

    def wait(self, version: Version | None) -> WatchedChange | None:
        self.backend.held_waits += 1
        if self.backend.broken:
            raise RendezvousBackendError("the watch broke (test)")
        # MemoryBackend.get, not the recording one: the watch's own event carries the entry.
        if not MemoryBackend.watch(self.backend, self.key, version=version, timeout=self.remaining()):
            return None
        return WatchedChange(MemoryBackend.get(self.backend, self.key))

    def close(self) -> None:
        self.closed = True


class HoldingBackend(MemoryBackend):
    """A memory backend that holds watches and records its reads as ``(operation, key)``.

    Like etcd's, it cannot send a node's seat with a change (``wait_with`` blocked): the header
    carries the roster to the nodes it wakes.
    """

    wait_with = None  # type: ignore[assignment]

    def __init__(self, run_id: str, *, broken: bool = False) -> None:
        super().__init__(run_id)
        self.broken = broken
        self.calls: list[tuple[str, str]] = []
        self.held: list[_Held] = []
        self.held_waits = 0
        self.calls_before_shutdown: list[tuple[str, str]] = []

    def hold_watch(self, key: str, *, timeout: float) -> HeldWatch:
        held = _Held(self, key, timeout)
        self.held.append(held)
        return held

    def list(self, prefix: str) -> dict[str, Entry]:
        self.calls.append(("list", prefix))
        return super().list(prefix)

    def get(self, key: str) -> Entry | None:
        self.calls.append(("get", key))
        return super().get(key)

    def add(self, key: str, amount: int = 1) -> int:
        self.calls.append(("add", key))
        return super().add(key, amount)

    def compare_and_set(self, key: str, value: Any, *, version: Any, ttl: float | None = None) -> Any:
        self.calls.append(("compare_and_set", key))
        return super().compare_and_set(key, value, version=version, ttl=ttl)

    def watch(self, key: str, *, version: Version | None, timeout: float) -> bool:
        self.calls.append(("watch", key))
        return super().watch(key, version=version, timeout=timeout)


def _first_waits_then_second_completes(
    a: HoldingBackend, b: HoldingBackend, *, min_nodes: int = 2, max_nodes: int = 2, timeouts: Any = QUIET
) -> tuple[RendezvousResult, RendezvousResult]:
    first = RendezvousHandler(a, make_node(0), min_nodes=min_nodes, max_nodes=max_nodes, timeouts=timeouts)
    second = RendezvousHandler(b, make_node(1), min_nodes=min_nodes, max_nodes=max_nodes, timeouts=timeouts)
    results: dict[str, RendezvousResult] = {}
    t = threading.Thread(target=lambda: results.update(first=first.next_rendezvous()))
    try:
        t.start()
        deadline = time.monotonic() + 10
        while not any(call[0] == "add" for call in a.calls) and time.monotonic() < deadline:
            time.sleep(0.01)  # the first node has its ticket; it joins and waits next
        time.sleep(0.2)
        results["second"] = second.next_rendezvous()
        t.join(20)
        assert not t.is_alive(), "the waiting node never returned"
        a.calls_before_shutdown = list(a.calls)
        b.calls_before_shutdown = list(b.calls)
        return results["first"], results["second"]
    finally:
        first.shutdown()
        second.shutdown()


def test_a_node_that_waits_for_its_round_reads_nothing_after_its_join() -> None:
    """Woken by the complete header, it finishes from the watch's change alone (its roster was
    fetched by this process already). It used to read the round (header and counter) again."""
    ROSTERS.clear()
    run_id = f"held-{uuid.uuid4().hex[:8]}"
    a, b = HoldingBackend(run_id), HoldingBackend(run_id)
    first, second = _first_waits_then_second_completes(a, b)
    assert {first.group_rank, second.group_rank} == {0, 1}
    assert first.participants == second.participants
    calls = a.calls_before_shutdown
    joined = max(i for i, call in enumerate(calls) if call[0] == "add" and call[1].startswith("round/count/"))
    assert calls[joined + 1 :] == [], calls
    assert a.held_waits == 1
    assert all(h.closed for h in a.held + b.held)  # the completing node never waited on its own


def test_a_broken_held_watch_costs_a_read_not_the_round() -> None:
    ROSTERS.clear()
    run_id = f"held-{uuid.uuid4().hex[:8]}"
    a, b = HoldingBackend(run_id, broken=True), HoldingBackend(run_id)
    first, second = _first_waits_then_second_completes(a, b)
    assert {first.group_rank, second.group_rank} == {0, 1}
    assert a.held_waits == 1
    calls = a.calls_before_shutdown
    joined = max(i for i, call in enumerate(calls) if call[0] == "add" and call[1].startswith("round/count/"))
    assert ("list", "round/") in calls[joined + 1 :], calls  # it read the round instead


def test_a_wait_shorter_than_the_held_watch_is_a_plain_watch() -> None:
    """A last call ends the wait before the held watch's deadline (the first liveness check): the
    node must wake for it, not sleep on until the held watch ends."""
    ROSTERS.clear()
    run_id = f"held-{uuid.uuid4().hex[:8]}"
    a, b = HoldingBackend(run_id), HoldingBackend(run_id)
    short = RendezvousTimeouts(join=60, last_call=0.3, close=5, heartbeat_interval=30, heartbeat_timeout=60)
    started = time.monotonic()
    first, second = _first_waits_then_second_completes(a, b, min_nodes=2, max_nodes=3, timeouts=short)
    assert time.monotonic() - started < 10
    assert (first.num_nodes, second.num_nodes) == (2, 2)
    # The first node waits for a second on its held watch; the second's wait is the last call.
    assert b.held_waits == 0
    assert ("watch", HEADER_KEY) in b.calls_before_shutdown


def test_the_memory_double_holds_watches() -> None:
    assert isinstance(HoldingBackend("x"), SupportsHeldWatch)
    assert not isinstance(MemoryBackend("y"), SupportsHeldWatch)
