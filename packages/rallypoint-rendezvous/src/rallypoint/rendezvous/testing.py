# ruff: noqa: D102  (the test methods are named for what they check)
"""The rendezvous conformance kit: reusable pytest suites every backend runs against itself.

Usage, in a backend's test module::

    import pytest
    from rallypoint.rendezvous.testing import (
        MultiProcessBackendConformance, MultiProcessHandlerConformance)

    class MyFactory:
        def __init__(self, root):
            self.root = root
        def __call__(self, run_id):  # a fresh client of the same space for every call
            return MyBackend(self.root, run_id)

    class TestMyBackend(MultiProcessBackendConformance):
        @pytest.fixture
        def backend_factory(self, tmp_path):
            return MyFactory(tmp_path)

    class TestMyHandler(MultiProcessHandlerConformance):
        @pytest.fixture
        def backend_factory(self, tmp_path):
            return MyFactory(tmp_path)

``backend_factory`` returns a callable ``run_id -> backend``; every call must return a new
client of the same space. Each test uses a fresh run id. An in-process backend uses
:class:`BackendConformance` and :class:`HandlerConformance` (threads only); a backend shared
between processes uses the ``MultiProcess`` variants, which add checks with real processes
started by a fork server (so the factory must be a small picklable object: an instance of a class
defined at module level, in the test module or its conftest, holding plain picklable state).
``forkserver`` rather than ``fork``: a test process that has started gRPC (an etcd or gRPC client,
or a server fixture) holds threads and locks that a plain ``fork`` would copy half-held, and the
children then hang; the fork server is a fresh interpreter that never started them.

The kit checks: basic reads and writes, JSON-only values, key validation, run-id scoping,
version tokens, compare-and-set and atomic add under races between threads and processes,
delete, prefix listing at scale, write ordering seen from another process, watch wake-ups and
timeouts, TTL expiry (when ``supports_ttl``), and the handler on top: N nodes join, a late node
waits, a node dies, close, join timeout, the assignment function's value reaching each member.
Writing many keys and waiting with more keys are checked on every backend (through the fallbacks
where it lacks them). A backend that offers the optional held watch adds
:class:`HeldWatchConformance` to its backend class; one that writes many keys in one call,
:class:`SetManyConformance`; one that sends more keys with a change, :class:`WaitWithConformance`.

For torch interop, :func:`run_torchrun_agents` starts real ``torchrun`` agents that meet through a
backend's ``--rdzv-backend rallypoint-<name>`` handler and run :data:`TORCHRUN_JOB` (a gloo
all_reduce), and :func:`assert_torch_registry_has` checks torch's handler registry lists it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
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
from rallypoint.rendezvous.errors import RendezvousClosedError, RendezvousTimeoutError
from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult
from rallypoint.rendezvous.state import NodeInfo
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = [
    "FAST_TIMEOUTS",
    "BackendConformance",
    "HandlerConformance",
    "HeldWatchConformance",
    "MultiProcessBackendConformance",
    "MultiProcessHandlerConformance",
    "SetManyConformance",
    "WaitWithConformance",
    "TORCHRUN_JOB",
    "assert_torch_registry_has",
    "make_node",
    "run_torchrun_agents",
]

Factory = Callable[[str], RendezvousBackend]

#: Short timeouts for handler tests.
FAST_TIMEOUTS = RendezvousTimeouts(join=20.0, last_call=0.2, close=5.0, heartbeat_interval=0.1, heartbeat_timeout=0.6)


def make_node(i: int, **kw: Any) -> NodeInfo:
    """A test node record ``node<i>``."""
    return NodeInfo(node_id=f"node{i}", host=f"host{i}", addr="127.0.0.1", master_port=30000 + i, **kw)


def _ctx() -> Any:
    """The multiprocessing context of the kit's child processes: a fork server.

    The server is a fresh interpreter (started once per test process); children fork from it, so
    nothing the test process started (gRPC threads, locks held by them) leaks into a child. The
    kit is preloaded in the server so each child starts quickly.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["rallypoint.rendezvous.testing"])  # effective until the server starts
    return ctx


def _import_roots(cls: type) -> list[str]:
    """The sys.path entry under which ``cls``'s module is importable by its dotted name."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return []
    return [str(Path(path).resolve().parents[cls.__module__.count(".")])]


def _restore_factory(roots: list[str], payload: bytes) -> Factory:
    for root in roots:
        if root not in sys.path:
            sys.path.insert(0, root)
    factory: Factory = pickle.loads(payload)  # our own bytes, from the parent test process
    return factory


class _Portable:
    """Carries a backend factory into a child even when its class is defined in a test module.

    Under pytest's ``--import-mode=importlib`` test modules are not importable by name from a fresh
    interpreter; the child first puts the module's root on ``sys.path``, then unpickles.
    """

    def __init__(self, factory: Factory) -> None:
        self.factory = factory

    def __reduce__(self) -> tuple[Any, tuple[list[str], bytes]]:
        return (_restore_factory, (_import_roots(type(self.factory)), pickle.dumps(self.factory)))

    def __call__(self, run_id: str) -> RendezvousBackend:
        return self.factory(run_id)


# -- child-process bodies (module level so that they survive any start method) --------------


def _cas_incrementer(factory: Factory, run_id: str, rounds: int, out: Any) -> None:
    backend = factory(run_id)
    won = []
    for _ in range(rounds):
        while True:
            entry = backend.get("counter")
            value = 0 if entry is None else entry.value
            ok, new = backend.compare_and_set("counter", value + 1, version=None if entry is None else entry.version)
            if ok:
                assert new is not None
                won.append(value + 1)
                break
    out.put(won)


def _adder(factory: Factory, run_id: str, rounds: int, out: Any) -> None:
    backend = factory(run_id)
    out.put([backend.add("sum", 1) for _ in range(rounds)])


def _joiner(factory: Factory, run_id: str, rounds: int, out: Any) -> None:
    backend = factory(run_id)
    counts = []
    for _ in range(rounds):
        created, _, count = create_and_add(backend, f"joined/{uuid.uuid4().hex}", "me", "joins", 1)
        assert created
        counts.append(count)
    out.put(counts)


def _sequential_writer(factory: Factory, run_id: str, n: int) -> None:
    backend = factory(run_id)
    for i in range(n):
        backend.set(f"seq/{i:04d}", i)


def _delayed_set(factory: Factory, run_id: str, key: str, delay: float) -> None:
    time.sleep(delay)
    factory(run_id).set(key, "changed")


def _join_process(
    factory: Factory,
    run_id: str,
    i: int,
    nodes: int,
    out: Any,
    timeouts: RendezvousTimeouts = FAST_TIMEOUTS,
    done: Any = None,
) -> None:
    handler = RendezvousHandler(factory(run_id), make_node(i), min_nodes=nodes, max_nodes=nodes, timeouts=timeouts)
    try:
        r = handler.next_rendezvous()
        out.put((i, r.round, r.group_rank, [p.node_id for p in r.participants], r.store.master_port))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out.put((i, "error", repr(exc)))
    finally:
        # Stay alive (heart-beating) until the parent has every node's result, then leave
        # without reopening the round.
        if done is not None:
            done.wait(120)


#: For checks where three nodes must land in one round however late a child process starts:
#: the round completes at once when the third joins (max_nodes), so the longer last call only
#: costs time when fewer join.
PATIENT_TIMEOUTS = dataclasses.replace(FAST_TIMEOUTS, last_call=2.0)


def _join_and_hang(factory: Factory, run_id: str, i: int, out: Any) -> None:
    handler = RendezvousHandler(factory(run_id), make_node(i), min_nodes=2, max_nodes=3, timeouts=PATIENT_TIMEOUTS)
    out.put((i, "started"))
    r = handler.next_rendezvous()
    out.put((i, r.round))
    time.sleep(60)  # killed by the test


def _collect(out: Any, n: int, timeout: float = 60.0, procs: Sequence[Any] = ()) -> list[Any]:
    """``n`` results from ``out``; fails at once (with the exit codes) when a child died without one."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        try:
            got.append(out.get(timeout=0.2))
            continue
        except queue.Empty:
            pass
        dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        if dead:
            raise AssertionError(f"{len(dead)} child process(es) failed (exit codes {dead}); see captured stderr")
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(got)} of {n} child results within {timeout:.0f} s")
    return got


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
        threads = [threading.Thread(target=_cas_incrementer, args=(backend_factory, run_id, 20, out)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        won = [v for lst in _collect(out, 6) for v in lst]
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


class HandlerConformance:
    """Handler-level checks on top of a backend. Override the ``backend_factory`` fixture."""

    @pytest.fixture
    def backend_factory(self) -> Factory:
        """Return a callable ``run_id -> backend`` (override in the backend's test class)."""
        raise NotImplementedError("override the backend_factory fixture")

    @pytest.fixture
    def run_id(self) -> str:
        """A fresh run id per test."""
        return f"hconf-{uuid.uuid4().hex[:10]}"

    def _handlers(
        self,
        factory: Factory,
        run_id: str,
        n: int,
        lo: int,
        hi: int,
        timeouts: RendezvousTimeouts = FAST_TIMEOUTS,
        pm: Any = None,
    ) -> list[RendezvousHandler]:
        return [
            RendezvousHandler(factory(run_id), make_node(i), min_nodes=lo, max_nodes=hi, timeouts=timeouts, pm=pm)
            for i in range(n)
        ]

    @staticmethod
    def _in_threads(handlers: list[RendezvousHandler]) -> list[RendezvousResult | BaseException]:
        results: list[RendezvousResult | BaseException] = [RuntimeError("no result")] * len(handlers)

        def run(i: int) -> None:
            try:
                results[i] = handlers[i].next_rendezvous()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                results[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(handlers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return results

    @staticmethod
    def _assert_agree(results: list[Any], n: int) -> list[RendezvousResult]:
        assert all(isinstance(r, RendezvousResult) for r in results), results
        good: list[RendezvousResult] = results
        assert sorted(r.group_rank for r in good) == list(range(n))
        first = good[0]
        for r in good:
            assert (r.round, r.num_nodes, r.participants, r.store) == (first.round, n, first.participants, first.store)
            assert r.participants[r.group_rank] == r.node
        assert first.store.master_addr == first.participants[0].addr
        assert first.store.master_port == first.participants[0].master_port
        return good

    def test_nodes_join_and_agree(self, backend_factory: Factory, run_id: str) -> None:
        handlers = self._handlers(backend_factory, run_id, 4, 4, 4)
        start = time.monotonic()
        try:
            results = self._assert_agree(self._in_threads(handlers), 4)
            assert time.monotonic() - start < FAST_TIMEOUTS.last_call + 5
            assert results[0].run_id == run_id
            assert {p.node_id for p in results[0].participants} == {f"node{i}" for i in range(4)}
        finally:
            for h in handlers:
                h.shutdown()

    def test_assignment_reaches_each_member(self, backend_factory: Factory, run_id: str) -> None:
        """The assignment function runs on the node that completes the round; each member gets its own value.

        Where the backend sends a member its seat with the change (``wait_with``), every member
        receives its value and the function ran once. Elsewhere a member may receive ``None``
        (the header carried the roster instead) and computes the value itself.
        """
        calls: list[int] = []

        def assign(members: Sequence[NodeInfo]) -> list[dict[str, Any]]:
            calls.append(len(members))
            return [{"id": m.node_id, "of": len(members)} for m in members]

        handlers = [
            RendezvousHandler(
                backend_factory(run_id), make_node(i), min_nodes=3, max_nodes=3, timeouts=FAST_TIMEOUTS, assign=assign
            )
            for i in range(3)
        ]
        try:
            results = self._assert_agree(self._in_threads(handlers), 3)
        finally:
            for h in handlers:
                h.shutdown()
        for r in results:
            assert r.assigned in (None, {"id": r.node.node_id, "of": 3}), r.assigned
        assert set(calls) <= {3}  # never run without seats (the header carried the roster)
        if isinstance(handlers[0].backend, SupportsWaitWith):
            assert [r.assigned for r in results] == [{"id": r.node.node_id, "of": 3} for r in results]
            assert len(calls) == 1, "the assignment function ran more than once"

    def test_late_node_waits_then_joins_next_round(self, backend_factory: Factory, run_id: str) -> None:
        a, b, c = self._handlers(backend_factory, run_id, 3, 2, 3)
        try:
            first = self._assert_agree(self._in_threads([a, b]), 2)
            late: list[Any] = []
            t = threading.Thread(target=lambda: late.append(c.next_rendezvous()))
            t.start()
            deadline = time.monotonic() + 10
            while a.num_nodes_waiting() == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert a.num_nodes_waiting() == 1
            assert b.num_nodes_waiting() == 1
            second = self._in_threads([a, b])
            t.join(30)
            results = self._assert_agree([*second, *late], 3)
            assert results[0].round > first[0].round
            # Previous members keep their ranks; the newcomer comes last.
            assert [p.node_id for p in results[0].participants][2] == "node2"
        finally:
            for h in (a, b, c):
                h.shutdown()

    def test_dead_node_is_detected_and_survivors_continue(self, backend_factory: Factory, run_id: str) -> None:
        handlers = self._handlers(backend_factory, run_id, 3, 2, 3)
        try:
            first = self._assert_agree(self._in_threads(handlers), 3)
            victim = handlers[1]
            victim._stop.set()  # its heartbeats stop, as if the process froze or died
            start = time.monotonic()
            survivors = [handlers[0], handlers[2]]
            while not all(h.round_is_over() for h in survivors):
                assert time.monotonic() - start < FAST_TIMEOUTS.heartbeat_timeout + 5, "dead peer not detected"
                time.sleep(0.02)
            assert all(h.num_nodes_waiting() >= 1 for h in survivors)
            second = self._assert_agree(self._in_threads(survivors), 2)
            assert second[0].round > first[0].round
            assert "node1" not in [p.node_id for p in second[0].participants]
        finally:
            for h in handlers:
                h.shutdown()

    def test_close_ends_the_job_for_everyone(self, backend_factory: Factory, run_id: str) -> None:
        handlers = self._handlers(backend_factory, run_id, 2, 2, 2)
        try:
            self._assert_agree(self._in_threads(handlers), 2)
            assert not handlers[1].is_closed()
            handlers[0].set_closed()
            assert handlers[1].is_closed()
            with pytest.raises(RendezvousClosedError, match="closed"):
                handlers[1].next_rendezvous()
            newcomer = self._handlers(backend_factory, run_id, 3, 1, 3)[2]
            with pytest.raises(RendezvousClosedError):
                newcomer.next_rendezvous()
        finally:
            for h in handlers:
                h.shutdown()

    def test_leaving_is_not_closing(self, backend_factory: Factory, run_id: str) -> None:
        handlers = self._handlers(backend_factory, run_id, 3, 2, 3)
        try:
            self._assert_agree(self._in_threads(handlers), 3)
            handlers[2].shutdown()
            assert not handlers[0].is_closed()
            assert handlers[0].round_is_over()
            self._assert_agree(self._in_threads(handlers[:2]), 2)
        finally:
            for h in handlers:
                h.shutdown()

    def test_join_timeout_names_the_nodes(self, backend_factory: Factory, run_id: str) -> None:
        timeouts = RendezvousTimeouts(join=0.4, last_call=0.1, close=5, heartbeat_interval=0.1, heartbeat_timeout=0.5)
        seen: list[Any] = []

        class Recorder:
            from rallypoint.core.plugins import hookimpl

            @hookimpl
            def rallypoint_rendezvous_timed_out(self, info: Any) -> None:
                seen.append(info)

        from rallypoint.core.plugins import get_plugin_manager

        pm = get_plugin_manager(plugins=[Recorder()], autoload=False)
        (h,) = self._handlers(backend_factory, run_id, 1, 2, 2, timeouts=timeouts, pm=pm)
        start = time.monotonic()
        with pytest.raises(RendezvousTimeoutError) as err:
            h.next_rendezvous()
        assert 0.35 <= time.monotonic() - start < 5
        info = err.value.info
        assert info.timeout == "join"
        assert info.seconds == 0.4
        assert info.present == ("node0",)
        assert "join timeout (0.4s)" in str(err.value)
        assert "1 more node(s)" in str(err.value)
        assert seen == [info]
        # The node withdrew: a later pair forms a round without it.
        others = [
            RendezvousHandler(backend_factory(run_id), make_node(i), min_nodes=2, max_nodes=2, timeouts=FAST_TIMEOUTS)
            for i in (5, 6)
        ]
        res = self._assert_agree(self._in_threads(others), 2)
        assert {p.node_id for p in res[0].participants} == {"node5", "node6"}
        for o in (*others, h):
            o.shutdown()


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
        ctx = _ctx()
        out = ctx.Queue()
        portable = _Portable(factory)
        procs = [ctx.Process(target=target, args=(portable, run_id, rounds, out)) for _ in range(self.processes)]
        for p in procs:
            p.start()
        seen = [v for lst in _collect(out, len(procs), procs=procs) for v in lst]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        return seen

    def test_cas_race_between_processes(self, backend_factory: Factory, run_id: str) -> None:
        won = self._in_processes(_cas_incrementer, backend_factory, run_id, 15)
        total = 15 * self.processes
        assert sorted(won) == list(range(1, total + 1)), "two processes won the same compare-and-set"
        entry = backend_factory(run_id).get("counter")
        assert entry is not None
        assert entry.value == total

    def test_add_between_processes(self, backend_factory: Factory, run_id: str) -> None:
        seen = self._in_processes(_adder, backend_factory, run_id, 30)
        assert sorted(seen) == list(range(1, 30 * self.processes + 1))

    def test_create_and_add_between_processes(self, backend_factory: Factory, run_id: str) -> None:
        seen = self._in_processes(_joiner, backend_factory, run_id, 15)
        assert sorted(seen) == list(range(1, 15 * self.processes + 1)), "two joins got the same count"
        assert len(backend_factory(run_id).list("joined/")) == 15 * self.processes

    def test_writes_seen_in_order_from_another_process(self, backend_factory: Factory, run_id: str) -> None:
        ctx = _ctx()
        writer = ctx.Process(target=_sequential_writer, args=(_Portable(backend_factory), run_id, 200))
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
        p = _ctx().Process(target=_delayed_set, args=(_Portable(backend_factory), run_id, "w", 0.2))
        p.start()
        start = time.monotonic()
        assert backend.watch("w", version=None, timeout=30)  # woken by the other process's write
        assert time.monotonic() - start < 20
        p.join(10)


class MultiProcessHandlerConformance(HandlerConformance):
    """Handler checks with nodes in separate processes (one is killed with SIGKILL)."""

    def test_processes_rendezvous(self, backend_factory: Factory, run_id: str) -> None:
        self._processes_rendezvous(backend_factory, run_id, 4)

    def test_killed_process_is_detected(self, backend_factory: Factory, run_id: str) -> None:
        ctx = _ctx()
        out = ctx.Queue()
        victim = ctx.Process(target=_join_and_hang, args=(_Portable(backend_factory), run_id, 9, out))
        victim.start()
        # Wait for the victim to be joining: a fork-server child may start later than the
        # in-process handlers, and must not miss their round.
        assert _collect(out, 1, 60, [victim]) == [(9, "started")]
        a, b = self._handlers(backend_factory, run_id, 2, 2, 3, timeouts=PATIENT_TIMEOUTS)
        try:
            results = self._in_threads([a, b])
            assert out.get(timeout=30)[1] == results[0].round  # type: ignore[union-attr]
            assert all(isinstance(r, RendezvousResult) and r.num_nodes == 3 for r in results)
            victim.kill()
            victim.join(10)
            start = time.monotonic()
            while not a.round_is_over():
                assert time.monotonic() - start < FAST_TIMEOUTS.heartbeat_timeout + 5
                time.sleep(0.02)
            second = self._assert_agree(self._in_threads([a, b]), 2)
            assert "node9" not in [p.node_id for p in second[0].participants]
        finally:
            a.shutdown()
            b.shutdown()
            if victim.is_alive():
                victim.kill()

    def _processes_rendezvous(
        self,
        factory: Factory,
        run_id: str,
        n: int,
        timeout: float = 120.0,
        timeouts: RendezvousTimeouts = FAST_TIMEOUTS,
    ) -> float:
        """Start ``n`` node processes that rendezvous (min = max = n); check they agree; return seconds."""
        ctx = _ctx()
        out = ctx.Queue()
        done = ctx.Event()
        fac = _Portable(factory)
        procs = [ctx.Process(target=_join_process, args=(fac, run_id, i, n, out, timeouts, done)) for i in range(n)]
        start = time.monotonic()
        for p in procs:
            p.start()
        try:
            got = _collect(out, n, timeout, procs)
            elapsed = time.monotonic() - start
        finally:
            done.set()
            for p in procs:
                p.join(30)
        errors = [g for g in got if g[1] == "error"]
        assert not errors, errors
        rounds = {g[1] for g in got}
        members = {tuple(g[3]) for g in got}
        assert len(rounds) == 1, "nodes disagree on the round"
        assert len(members) == 1, "nodes disagree on the participants"
        assert sorted(g[2] for g in got) == list(range(n))
        (order,) = members
        assert all(order[g[2]] == f"node{g[0]}" for g in got)
        assert len({g[4] for g in got}) == 1
        return elapsed


# ------------------------------------------------------------------------------------------------
# torch interop: real torchrun agents meeting through a backend's torch rendezvous handler.

#: The job :func:`run_torchrun_agents` runs: each worker all-reduces ``rank + 1`` over gloo and prints
#: one ``RESULT rank=R world=W sum=S group=G`` line.
TORCHRUN_JOB = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
print(f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g} "
      f"group={os.environ['GROUP_RANK']}", flush=True)
dist.destroy_process_group()
"""


def assert_torch_registry_has(torch_name: str, timeout: float = 180.0) -> None:
    """Check, in a fresh interpreter, that importing torch's rendezvous registry lists ``torch_name``.

    The fresh interpreter matters: the handler must be registered by the installed entry point
    (``torch.distributed.elastic`` loads them), not by something the test process imported.
    """
    import subprocess

    code = (
        "from torch.distributed.elastic.rendezvous.registry import handler_registry as r\n"
        f"assert {torch_name!r} in r._registry, sorted(r._registry)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=timeout)


def run_torchrun_agents(
    torch_name: str,
    endpoint: str,
    workdir: Path,
    *conf: str,
    rdzv_id: str = "interop",
    nnodes: int = 2,
    timeout: float = 240.0,
) -> list[str]:
    """Run ``nnodes`` torchrun agents (one worker each) through ``--rdzv-backend torch_name``.

    Every agent must exit 0 (the assertion carries all agents' output). Returns the workers'
    ``RESULT`` lines, sorted; for two nodes they are
    ``["RESULT rank=0 world=2 sum=3 group=0", "RESULT rank=1 world=2 sum=3 group=1"]``.

    Args:
        torch_name: the name torch knows the handler by (``rallypoint-file``).
        endpoint: ``--rdzv-endpoint``.
        workdir: where the job script is written and the agents run.
        conf: extra torchrun arguments (``"--rdzv-conf", "key=value"``).
        rdzv_id: ``--rdzv-id``.
        nnodes: how many agents.
        timeout: seconds each agent may take.
    """
    import os
    import subprocess

    script = workdir / "torchrun_job.py"
    script.write_text(TORCHRUN_JOB)
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun), "--nnodes", str(nnodes), "--nproc-per-node", "1",
        "--rdzv-backend", torch_name, "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id,
        *conf, "--monitor-interval", "0.1", str(script),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir)
        for _ in range(nnodes)
    ]
    outputs: list[str] = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=timeout)
            outputs.append(out)
        codes = [a.returncode for a in agents]
        assert codes == [0] * nnodes, f"torchrun agents exited {codes}:\n" + "\n----\n".join(outputs)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    return sorted(line for out in outputs for line in out.splitlines() if line.startswith("RESULT"))
