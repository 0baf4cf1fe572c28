# ruff: noqa: D102  (the test methods are named for what they check)
"""The handler checks on top of a backend: nodes join, a late one waits, one dies, close, timeouts."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from rallypoint.rendezvous.backend import SupportsWaitWith
from rallypoint.rendezvous.errors import RendezvousClosedError, RendezvousTimeoutError
from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult
from rallypoint.rendezvous.state import NodeInfo
from rallypoint.rendezvous.testing.nodes import FAST_TIMEOUTS, PATIENT_TIMEOUTS, Factory, make_node
from rallypoint.rendezvous.testing.processes import Portable, collect, fork_server, join_and_hang, join_process
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = ["HandlerConformance", "MultiProcessHandlerConformance"]


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


class MultiProcessHandlerConformance(HandlerConformance):
    """Handler checks with nodes in separate processes (one is killed with SIGKILL)."""

    def test_processes_rendezvous(self, backend_factory: Factory, run_id: str) -> None:
        self._processes_rendezvous(backend_factory, run_id, 4)

    def test_killed_process_is_detected(self, backend_factory: Factory, run_id: str) -> None:
        ctx = fork_server()
        out = ctx.Queue()
        victim = ctx.Process(target=join_and_hang, args=(Portable(backend_factory), run_id, 9, out))
        victim.start()
        # Wait for the victim to be joining: a fork-server child may start later than the
        # in-process handlers, and must not miss their round.
        assert collect(out, 1, 60, [victim]) == [(9, "started")]
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
        ctx = fork_server()
        out = ctx.Queue()
        done = ctx.Event()
        fac = Portable(factory)
        procs = [ctx.Process(target=join_process, args=(fac, run_id, i, n, out, timeouts, done)) for i in range(n)]
        start = time.monotonic()
        for p in procs:
            p.start()
        try:
            got = collect(out, n, timeout, procs)
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
