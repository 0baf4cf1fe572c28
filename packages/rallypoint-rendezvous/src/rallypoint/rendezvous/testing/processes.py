"""The kit's child processes: a fork server, the backend factory carried into them, what they run."""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rallypoint.rendezvous.backend import RendezvousBackend, create_and_add
from rallypoint.rendezvous.handler import RendezvousHandler
from rallypoint.rendezvous.testing.nodes import FAST_TIMEOUTS, PATIENT_TIMEOUTS, Factory, make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = [
    "Portable", "collect", "fork_server",
    "adder", "cas_incrementer", "delayed_set", "join_and_hang", "join_process", "joiner", "sequential_writer",
]  # fmt: skip


def fork_server() -> Any:
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


class Portable:
    """Carries a backend factory into a child even when its class is defined in a test module.

    Under pytest's ``--import-mode=importlib`` test modules are not importable by name from a fresh
    interpreter; the child first puts the module's root on ``sys.path``, then unpickles.
    """

    def __init__(self, factory: Factory) -> None:
        self.factory = factory

    def __reduce__(self) -> tuple[Any, tuple[list[str], bytes]]:
        return (_restore_factory, (_import_roots(type(self.factory)), pickle.dumps(self.factory)))

    def __call__(self, run_id: str) -> RendezvousBackend:
        """A client of ``run_id``'s space, from the carried factory."""
        return self.factory(run_id)


# -- what the children run (module level, so that a child can import them by name) ------------


def cas_incrementer(factory: Factory, run_id: str, rounds: int, out: Any) -> None:
    """Win ``rounds`` compare-and-set increments of ``counter``; put the values won."""
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


def adder(factory: Factory, run_id: str, rounds: int, out: Any) -> None:
    """Add 1 to ``sum`` ``rounds`` times; put the totals seen."""
    backend = factory(run_id)
    out.put([backend.add("sum", 1) for _ in range(rounds)])


def joiner(factory: Factory, run_id: str, rounds: int, out: Any) -> None:
    """Make ``rounds`` joins with ``create_and_add``; put the counts they got."""
    backend = factory(run_id)
    counts = []
    for _ in range(rounds):
        created, _, count = create_and_add(backend, f"joined/{uuid.uuid4().hex}", "me", "joins", 1)
        assert created
        counts.append(count)
    out.put(counts)


def sequential_writer(factory: Factory, run_id: str, n: int) -> None:
    """Write ``seq/0000`` ... in order, ``n`` keys."""
    backend = factory(run_id)
    for i in range(n):
        backend.set(f"seq/{i:04d}", i)


def delayed_set(factory: Factory, run_id: str, key: str, delay: float) -> None:
    """After ``delay`` seconds, set ``key``."""
    time.sleep(delay)
    factory(run_id).set(key, "changed")


def join_process(
    factory: Factory,
    run_id: str,
    i: int,
    nodes: int,
    out: Any,
    timeouts: RendezvousTimeouts = FAST_TIMEOUTS,
    done: Any = None,
) -> None:
    """One node of a rendezvous of ``nodes`` nodes; put its result (or its error), then wait for ``done``."""
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


def join_and_hang(factory: Factory, run_id: str, i: int, out: Any) -> None:
    """Join a round of 2-3 nodes, say so, then hang until killed."""
    handler = RendezvousHandler(factory(run_id), make_node(i), min_nodes=2, max_nodes=3, timeouts=PATIENT_TIMEOUTS)
    out.put((i, "started"))
    r = handler.next_rendezvous()
    out.put((i, r.round))
    time.sleep(60)  # killed by the test


def collect(out: Any, n: int, timeout: float = 60.0, procs: Sequence[Any] = ()) -> list[Any]:
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
