# ruff: noqa: D102  (the test methods are named for what they check)
"""The backend checks: the key-value protocol, from threads, then from processes; the held watch."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from rallypoint.rendezvous.backend import (
    RendezvousBackend,
    SupportsHeldWatch,
    SupportsSetMany,
    SupportsWaitWith,
    check_in,
    create_and_add,
    set_many,
    wait_with,
)
from rallypoint.rendezvous.testing.nodes import Factory
from rallypoint.rendezvous.testing.processes import (
    Portable,
    adder,
    cas_incrementer,
    collect,
    delayed_set,
    fork_server,
    joiner,
    sequential_writer,
)

__all__ = [
    "BackendConformance",
    "HeldWatchConformance",
    "MultiProcessBackendConformance",
    "SetManyConformance",
    "WaitWithConformance",
]


class BackendConformance:
    """Key-value protocol checks (one process, several threads). Override ``backend_factory``."""

    @pytest.fixture
    def backend_factory(self) -> Factory:
        """Return a callable ``run_id -> backend`` (override in the backend's test class)."""
        raise NotImplementedError("override the backend_factory fixture")

    @pytest.fixture
    def run_id(self) -> str:
        """A fresh run id per test."""
        return f"conf-{uuid.uuid4().hex[:10]}"

    @pytest.fixture
    def backend(self, backend_factory: Factory, run_id: str) -> RendezvousBackend:
        """One client."""
        return backend_factory(run_id)

    # -- basics ------------------------------------------------------------------------
    def test_get_missing_is_none(self, backend: RendezvousBackend) -> None:
        assert backend.get("nothing/here") is None

    def test_json_values_round_trip(self, backend: RendezvousBackend) -> None:
        value = {"a": [1, 2.5, "x", None, True], "ü": {"nested": {"deep": -3}}}
        version = backend.set("doc", value)
        entry = backend.get("doc")
        assert entry is not None
        assert entry.value == value
        assert entry.version == version
        scalars: tuple[Any, ...] = (0, "s", None, [], 1.5)
        for scalar in scalars:
            backend.set("scalar", scalar)
            got = backend.get("scalar")
            assert got is not None
            assert got.value == scalar

    def test_non_json_values_are_refused(self, backend: RendezvousBackend) -> None:
        with pytest.raises(TypeError, match="JSON"):
            backend.set("obj", object())
        with pytest.raises(TypeError, match="JSON"):
            backend.set("bytes", b"\x00pickle")
        assert backend.get("obj") is None

    def test_invalid_keys_are_refused(self, backend: RendezvousBackend) -> None:
        for key in ("", "/abs", "a//b", "sp ace", "a/b\n", "../up", "a/./b"):
            with pytest.raises(ValueError, match="invalid rendezvous key"):
                backend.set(key, 1)

    def test_spaces_are_scoped_by_run_id(self, backend_factory: Factory, run_id: str) -> None:
        a, b = backend_factory(run_id), backend_factory(run_id + "-other")
        a.set("k", "a")
        assert b.get("k") is None
        assert b.list("") == {}
        assert backend_factory(run_id).get("k") is not None

    def test_version_changes_on_every_write(self, backend: RendezvousBackend) -> None:
        versions = [backend.set("k", i) for i in range(5)]
        versions.append(backend.add("k", 1))  # add returns the value, the version is in get()
        entry = backend.get("k")
        assert entry is not None
        assert entry.value == 5
        assert len(set([*versions[:5], entry.version])) == 6

    def test_version_not_reused_after_delete(self, backend: RendezvousBackend) -> None:
        v1 = backend.set("k", 1)
        assert backend.delete("k")
        v2 = backend.set("k", 1)
        assert v1 != v2
        ok, _ = backend.compare_and_set("k", 2, version=v1)
        assert not ok

    # -- compare-and-set -------------------------------------------------------------
    def test_cas_create_only_if_absent(self, backend: RendezvousBackend) -> None:
        ok, entry = backend.compare_and_set("c", "first", version=None)
        assert ok
        assert entry is not None
        assert entry.value == "first"
        ok2, current = backend.compare_and_set("c", "second", version=None)
        assert not ok2
        assert current is not None
        assert current.value == "first"
        assert current.version == entry.version

    def test_cas_with_version(self, backend: RendezvousBackend) -> None:
        v = backend.set("c", 1)
        ok, entry = backend.compare_and_set("c", 2, version=v)
        assert ok
        assert entry is not None
        assert entry.value == 2
        assert entry.version != v
        stale, current = backend.compare_and_set("c", 3, version=v)
        assert not stale
        assert current is not None
        assert current.value == 2
        missing, none = backend.compare_and_set("absent", 1, version=v)
        assert not missing
        assert none is None

    def test_cas_race_between_threads(self, backend_factory: Factory, run_id: str) -> None:
        out: Any = __import__("queue").Queue()
        threads = [threading.Thread(target=cas_incrementer, args=(backend_factory, run_id, 20, out)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        won = [v for lst in collect(out, 6) for v in lst]
        assert sorted(won) == list(range(1, 121))
        entry = backend_factory(run_id).get("counter")
        assert entry is not None
        assert entry.value == 120

    # -- add / delete / list ---------------------------------------------------------
    def test_add(self, backend: RendezvousBackend) -> None:
        assert backend.add("n") == 1
        assert backend.add("n", 5) == 6
        assert backend.add("n", -6) == 0
        backend.set("text", "x")
        with pytest.raises(TypeError, match="not an integer"):
            backend.add("text")

    def test_create_and_add(self, backend: RendezvousBackend) -> None:
        """A join: the key is created and the counter counts it, once (native or in two steps)."""
        assert create_and_add(backend, "join/1/a", {"n": "a"}, "count/1") == (True, None, 1)
        again, there, count = create_and_add(backend, "join/1/a", {"n": "other"}, "count/1")
        assert (again, count) == (False, 0)
        assert there is not None
        assert there.value == {"n": "a"}
        assert create_and_add(backend, "join/1/b", {"n": "b"}, "count/1", 2) == (True, None, 3)
        entry = backend.get("count/1")
        assert entry is not None
        assert entry.value == 3
        backend.set("text", "x")
        with pytest.raises(TypeError, match="not an integer"):
            create_and_add(backend, "join/1/c", {"n": "c"}, "text")
        assert backend.get("join/1/c") is None  # nothing written
        text = backend.get("text")
        assert text is not None
        assert text.value == "x"

    def test_check_in(self, backend: RendezvousBackend) -> None:
        """A node's first request: the round keys read, and a ticket taken unless the run is closed or another job's."""
        backend.set("round/header", {"round": 0})
        first = check_in(backend, "round/", "ticket", unless="round/closed", claim=("job", {"j": 1}))
        assert first.count == 1
        assert {k: e.value for k, e in first.entries.items()} == {"round/header": {"round": 0}}
        assert first.claimed is not None
        assert first.claimed == backend.get("job")
        assert first.claimed.value == {"j": 1}
        assert check_in(backend, "round/", "ticket", unless="round/closed", claim=("job", {"j": 1})).count == 2
        other = check_in(backend, "round/", "ticket", unless="round/closed", claim=("job", {"j": 2}))
        assert other.count is None  # another job: refused, takes nothing
        assert other.claimed is not None
        assert other.claimed.value == {"j": 1}
        assert check_in(backend, "round/", "ticket", unless="round/closed").count == 3
        backend.set("round/closed", {"by": "n0"})
        closed = check_in(backend, "round/", "ticket", unless="round/closed", claim=("other-job", {"j": 3}))
        assert (closed.count, closed.claimed) == (None, None)  # closing: no ticket, no claim
        assert set(closed.entries) == {"round/header", "round/closed"}
        assert backend.get("other-job") is None
        ticket = backend.get("ticket")
        assert ticket is not None
        assert ticket.value == 3

    def test_delete(self, backend: RendezvousBackend) -> None:
        assert not backend.delete("none")
        v = backend.set("d", 1)
        backend.set("d", 2)
        assert not backend.delete("d", version=v)
        assert backend.get("d") is not None
        assert backend.delete("d")
        assert backend.get("d") is None
        assert not backend.delete("d")

    def test_list_by_prefix(self, backend: RendezvousBackend) -> None:
        for i in range(3):
            backend.set(f"join/1/n{i}", i)
        backend.set("join/10/n0", "other round")
        backend.set("joinx", "no")
        got = backend.list("join/1/")
        assert {k: e.value for k, e in got.items()} == {"join/1/n0": 0, "join/1/n1": 1, "join/1/n2": 2}
        assert set(backend.list("join/")) == {"join/1/n0", "join/1/n1", "join/1/n2", "join/10/n0"}
        assert set(backend.list("")) >= {"joinx", "join/10/n0"}
        assert backend.list("nothing/") == {}

    def test_large_n(self, backend: RendezvousBackend) -> None:
        n = 600
        for i in range(n):
            backend.set(f"big/{i:04d}", {"i": i, "pad": "x" * 64})
        got = backend.list("big/")
        assert len(got) == n
        assert all(e.value["i"] == int(k.split("/")[1]) for k, e in got.items())
        assert len({e.version for e in got.values()}) == n

    # -- watch -------------------------------------------------------------------------
    def test_watch_wakes_on_change(self, backend_factory: Factory, run_id: str) -> None:
        backend = backend_factory(run_id)
        v = backend.set("w", "before")
        writing = threading.Event()

        def change() -> None:
            writing.set()  # before the write: a watch that returns has seen no earlier wake-up
            backend_factory(run_id).set("w", "after")

        t = threading.Timer(0.15, change)
        t.start()
        start = time.monotonic()
        assert backend.watch("w", version=v, timeout=30)  # True: woken by the change, not the timeout
        elapsed = time.monotonic() - start
        t.join()
        assert writing.is_set(), f"watch returned after {elapsed:.3f}s, before the key changed"
        assert elapsed < 10, elapsed

    def test_watch_times_out(self, backend: RendezvousBackend) -> None:
        v = backend.set("w", 1)
        backend.set("unrelated", 1)
        start = time.monotonic()
        assert not backend.watch("w", version=v, timeout=0.2)
        assert 0.18 <= time.monotonic() - start < 10

    def test_watch_returns_at_once_when_already_changed(self, backend: RendezvousBackend) -> None:
        v = backend.set("w", 1)
        backend.set("w", 2)
        start = time.monotonic()
        assert backend.watch("w", version=v, timeout=60)
        assert backend.watch("gone", version=v, timeout=60)  # absent is not at version v
        assert time.monotonic() - start < 5, "a watch on an already-changed key blocked"

    def test_watch_sees_delete(self, backend_factory: Factory, run_id: str) -> None:
        backend = backend_factory(run_id)
        v = backend.set("w", 1)
        t = threading.Timer(0.1, lambda: backend_factory(run_id).delete("w"))
        t.start()
        assert backend.watch("w", version=v, timeout=10)
        t.join()

    def test_watch_prefix(self, backend_factory: Factory, run_id: str) -> None:
        backend = backend_factory(run_id)
        backend.set("p/a", 1)
        snapshot = {k: e.version for k, e in backend.list("p/").items()}
        other = backend_factory(run_id)
        # Changes elsewhere do not wake the watcher.
        t = threading.Timer(0.05, lambda: other.set("q/a", 1))
        t.start()
        assert not backend.watch_prefix("p/", versions=snapshot, timeout=0.3)
        t.join()
        for change in (lambda: other.set("p/b", 2), lambda: other.set("p/a", 3), lambda: other.delete("p/b")):
            snapshot = {k: e.version for k, e in backend.list("p/").items()}
            t = threading.Timer(0.05, change)
            t.start()
            start = time.monotonic()
            assert backend.watch_prefix("p/", versions=snapshot, timeout=30)  # woken, not timed out
            assert time.monotonic() - start < 10
            t.join()

    # -- TTL ---------------------------------------------------------------------------
    def test_ttl_expiry(self, backend: RendezvousBackend) -> None:
        if not backend.supports_ttl:
            with pytest.raises(NotImplementedError, match="TTL"):
                backend.set("lease", "held", ttl=0.2)
            assert backend.get("lease") is None
            return
        v = backend.set("lease", "held", ttl=0.2)
        backend.set("forever", "kept")
        assert backend.get("lease") is not None
        assert backend.watch("lease", version=v, timeout=5), "expiry must wake watchers"
        assert backend.get("lease") is None
        assert backend.get("forever") is not None

    def test_set_many(self, backend: RendezvousBackend) -> None:
        """Many keys in one call (or one by one, through the fallback); a bad key writes nothing."""
        items = {f"seat/n{i}": {"rank": i, "ring": [f"n{i + 1}"]} for i in range(50)}
        set_many(backend, {**items, "roster/0/d": {"members": list(range(10))}})
        assert {k: e.value for k, e in backend.list("seat/").items()} == items
        assert backend.get("roster/0/d").value == {"members": list(range(10))}  # type: ignore[union-attr]
        first = backend.get("seat/n0")
        set_many(backend, {"seat/n0": {"rank": 7}})
        again = backend.get("seat/n0")
        assert again is not None
        assert first is not None
        assert again.value == {"rank": 7}
        assert again.version != first.version
        with pytest.raises(ValueError, match="bad key"):
            set_many(backend, {"ok/key": 1, "bad key": 2})
        assert backend.get("ok/key") is None
        set_many(backend, {})

    def test_wait_with(self, backend_factory: Factory, run_id: str) -> None:
        """A change comes with the keys asked for (through the fallback where the backend lacks it)."""
        backend, other = backend_factory(run_id), backend_factory(run_id)
        seen = backend.set("h", "seen")
        t = threading.Timer(0.1, lambda: (other.set("mine", {"rank": 3}), other.set("h", "complete")))
        t.start()
        try:
            change = wait_with(backend, "h", version=seen, timeout=30, also=("mine", "absent"))
        finally:
            t.join()
        assert change is not None
        assert change.entry is not None
        assert change.entry.value == "complete"
        mine = change.also["mine"]
        assert mine is not None
        assert mine.value == {"rank": 3}
        assert change.also["absent"] is None
        start = time.monotonic()
        current = backend.get("h")
        assert current is not None
        assert wait_with(backend, "h", version=current.version, timeout=0.2, also=("mine",)) is None
        assert 0.15 <= time.monotonic() - start < 10


class HeldWatchConformance:
    """Checks of the optional held watch (:class:`~rallypoint.rendezvous.backend.SupportsHeldWatch`).

    For a backend that offers it: add this class to the backend's conformance class, e.g.
    ``class TestMyBackend(HeldWatchConformance, MultiProcessBackendConformance)``.
    """

    def test_held_watch(self, backend_factory: Factory, run_id: str) -> None:
        """Changes made after the watch was set up, with the key's new entry; the deadline."""
        backend = backend_factory(run_id)
        assert isinstance(backend, SupportsHeldWatch), f"{type(backend).__name__} has no hold_watch"
        other = backend_factory(run_id)
        seen = backend.set("h", "seen")
        held = backend.hold_watch("h", timeout=30)
        try:
            newer = other.set("h", "new")  # after the hold, before the wait: the watch has it
            change = held.wait(seen)
        finally:
            held.close()
        assert change is not None
        if change.entry is not None:  # a backend may leave it to a read
            assert (change.entry.value, change.entry.version) == ("new", newer)
        held = backend.hold_watch("h", timeout=30)
        try:
            current = backend.set("h", "read by the caller")  # the caller saw this one
            t = threading.Timer(0.15, lambda: other.delete("h"))
            t.start()
            start = time.monotonic()
            change = held.wait(current)
            t.join()
        finally:
            held.close()
        assert time.monotonic() - start >= 0.1, "woken by a change the caller had seen"
        assert change is not None
        assert change.entry is None  # deleted
        held = backend.hold_watch("h", timeout=0.2)
        try:
            start = time.monotonic()
            assert held.wait(None) is None  # absent all along: nothing changed before the deadline
            assert 0.15 <= time.monotonic() - start < 10
        finally:
            held.close()
            held.close()  # twice is harmless


class SetManyConformance:
    """The backend offers :class:`~rallypoint.rendezvous.backend.SupportsSetMany` (checked by ``test_set_many``).

    Add it to the backend's conformance class, as :class:`HeldWatchConformance`.
    """

    def test_offers_set_many(self, backend_factory: Factory, run_id: str) -> None:
        """Offered, and a value that is no JSON writes nothing."""
        backend = backend_factory(run_id)
        assert isinstance(backend, SupportsSetMany), f"{type(backend).__name__} has no set_many"
        with pytest.raises(TypeError):
            backend.set_many({"a": 1, "b": object()})
        assert backend.get("a") is None


class WaitWithConformance:
    """The backend offers :class:`~rallypoint.rendezvous.backend.SupportsWaitWith` (checked by ``test_wait_with``)."""

    def test_offers_wait_with(self, backend_factory: Factory, run_id: str) -> None:
        """Offered, and a change already made returns at once, with the keys asked for."""
        backend = backend_factory(run_id)
        assert isinstance(backend, SupportsWaitWith), f"{type(backend).__name__} has no wait_with"
        backend.set("x", {"seat": 1})
        version = backend.set("h", "now")
        change = backend.wait_with("h", version=None, timeout=30, also=("x",))
        assert change is not None
        assert change.entry is not None
        assert (change.entry.value, change.entry.version) == ("now", version)
        assert change.also["x"] is not None
        assert change.also["x"].value == {"seat": 1}


class MultiProcessBackendConformance(BackendConformance):
    """Key-value checks with clients in several processes (for backends shared between processes).

    The ``backend_factory`` must be picklable; child processes are started by a fork server.
    """

    processes: int = 6

    def _in_processes(self, target: Callable[..., None], factory: Factory, run_id: str, rounds: int) -> list[Any]:
        """Run ``target(factory, run_id, rounds, out)`` in :attr:`processes` processes; every value they put."""
        ctx = fork_server()
        out = ctx.Queue()
        portable = Portable(factory)
        procs = [ctx.Process(target=target, args=(portable, run_id, rounds, out)) for _ in range(self.processes)]
        for p in procs:
            p.start()
        seen = [v for lst in collect(out, len(procs), procs=procs) for v in lst]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        return seen

    def test_cas_race_between_processes(self, backend_factory: Factory, run_id: str) -> None:
        won = self._in_processes(cas_incrementer, backend_factory, run_id, 15)
        total = 15 * self.processes
        assert sorted(won) == list(range(1, total + 1)), "two processes won the same compare-and-set"
        entry = backend_factory(run_id).get("counter")
        assert entry is not None
        assert entry.value == total

    def test_add_between_processes(self, backend_factory: Factory, run_id: str) -> None:
        seen = self._in_processes(adder, backend_factory, run_id, 30)
        assert sorted(seen) == list(range(1, 30 * self.processes + 1))

    def test_create_and_add_between_processes(self, backend_factory: Factory, run_id: str) -> None:
        seen = self._in_processes(joiner, backend_factory, run_id, 15)
        assert sorted(seen) == list(range(1, 15 * self.processes + 1)), "two joins got the same count"
        assert len(backend_factory(run_id).list("joined/")) == 15 * self.processes

    def test_writes_seen_in_order_from_another_process(self, backend_factory: Factory, run_id: str) -> None:
        ctx = fork_server()
        writer = ctx.Process(target=sequential_writer, args=(Portable(backend_factory), run_id, 200))
        reader = backend_factory(run_id)
        writer.start()
        deadline = time.monotonic() + 30
        checks = 0
        while time.monotonic() < deadline:
            snapshot = reader.list("seq/")
            indices = sorted(int(k.split("/")[1]) for k in snapshot)
            # Whatever prefix of the writes is visible, it has no holes.
            assert indices == list(range(len(indices))), "a later write is visible before an earlier one"
            checks += 1
            if len(indices) == 200:
                break
        writer.join(30)
        assert len(reader.list("seq/")) == 200
        assert checks > 0

    def test_watch_wakes_on_change_from_another_process(self, backend_factory: Factory, run_id: str) -> None:
        backend = backend_factory(run_id)
        p = fork_server().Process(target=delayed_set, args=(Portable(backend_factory), run_id, "w", 0.2))
        p.start()
        start = time.monotonic()
        assert backend.watch("w", version=None, timeout=30)  # woken by the other process's write
        assert time.monotonic() - start < 20
        p.join(10)
