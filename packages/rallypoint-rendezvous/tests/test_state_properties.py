"""Property tests of the rendezvous state machine (TARGETS R9).

Several simulated nodes run the real state machine and the real action executor (RoundIO)
against one in-memory key-value space, single-threaded, on a simulated clock. Hypothesis
draws random schedules of steps, heartbeats, clock advances, crashes, restarts under the same
identity, re-rendezvous requests, departures and closes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rallypoint.rendezvous.handler import RoundIO
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.round_io import read_header, resolve
from rallypoint.rendezvous.state import (
    HEADER_KEY,
    CasHeader,
    Closed,
    Finished,
    Header,
    NodeInfo,
    RendezvousStateMachine,
    Settings,
    TimedOut,
    Wait,
    heartbeat_key,
    nodes_waiting,
)
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

TIMEOUTS = RendezvousTimeouts(join=10_000, last_call=3.0, close=10, heartbeat_interval=1.0, heartbeat_timeout=4.0)
_incarnations = itertools.count()


@dataclass
class SimNode:
    name: str
    io: RoundIO
    status: str = "idle"  # idle | joining | running | crashed | left | closed
    results: list[Finished] = field(default_factory=list)


class Sim:
    def __init__(self, n: int, min_nodes: int, max_nodes: int) -> None:
        self.backend = MemoryBackend("sim", shared=False)
        self.settings = Settings(min_nodes, max_nodes, TIMEOUTS, "sim")
        self.now = 0.0
        self.nodes = [self._make(f"n{i}") for i in range(n)]
        self.finished: dict[int, list[tuple[str, Finished]]] = {}

    def _make(self, name: str) -> SimNode:
        node = NodeInfo(name, host=name, addr=name, master_port=1000)
        sm = RendezvousStateMachine(node, f"inc{next(_incarnations)}", self.settings)
        return SimNode(name, RoundIO(self.backend, sm))

    def as_members_see_it(self, finished: Finished) -> Finished:
        """``finished`` with the round's whole roster (a member resolved its header from its seat alone)."""
        header = finished.header
        if header.seats and not header.participants:  # resolved from its seat
            header = resolve(self.backend, replace(header, index=None, ring=None))
        return Finished(header, finished.rank)

    # -- events --------------------------------------------------------------------------
    def start(self, node: SimNode) -> None:
        if node.status in ("idle", "running"):
            node.io.ensure_ticket()
            node.io.machine.begin(self.now)
            node.status = "joining"

    def step(self, node: SimNode) -> None:
        if node.status != "joining":
            return
        action, _ = node.io.decide(self.now)
        if isinstance(action, Finished):
            action = self.as_members_see_it(action)
            node.results.append(action)
            self.finished.setdefault(action.header.round, []).append((node.name, action))
            node.status = "running"
        elif isinstance(action, Closed):
            node.status = "closed"
        elif isinstance(action, TimedOut):  # pragma: no cover - join timeout is huge here
            node.io.withdraw()
            node.status = "idle"
        elif not isinstance(action, Wait):
            node.io.apply(action)

    def heartbeat(self, node: SimNode) -> None:
        if node.status not in ("joining", "running", "idle") or node.io.machine.ticket is None:
            return
        node.io.heartbeat()
        if node.status == "running":
            view = node.io.read()
            from dataclasses import replace

            peers = node.io.machine.watched_peers(view.header)
            view = replace(view, heartbeats=node.io.read_heartbeats(peers))
            action = node.io.machine.check_peers(view, self.now)
            if action is not None:
                node.io.apply(action)

    def crash(self, node: SimNode) -> None:
        if node.status not in ("crashed", "left", "closed"):
            node.status = "crashed"

    def restart(self, i: int) -> None:
        node = self.nodes[i]
        if node.status == "crashed":
            fresh = self._make(node.name)  # same identity, new incarnation
            fresh.results = node.results
            self.nodes[i] = fresh
            self.start(fresh)

    def leave(self, node: SimNode) -> None:
        if node.status in ("joining", "running"):
            view = node.io.read()
            action = node.io.machine.leave_header(view)
            if action is not None:
                node.io.apply(action)
            node.io.withdraw()
            self.backend.delete(heartbeat_key(node.name))
            node.status = "left"

    def close(self, node: SimNode) -> None:
        if node.status in ("joining", "running", "idle"):
            for _ in range(3):
                action = node.io.machine.close_header(node.io.read())
                if action is None or node.io.apply(action):
                    break

    def agent_poll(self, node: SimNode) -> None:
        """What an agent does: re-rendezvous when its round is over or nodes wait."""
        if node.status != "running":
            return
        m = node.io.machine
        h = node.io.read().header
        nxt = self.backend.get(f"round/count/{h.round + (1 if h.round == m.last_round else 0)}")
        waiting = nodes_waiting(m.last_round or 0, h, 0 if nxt is None else nxt.value, self.settings.max_nodes)
        if waiting:
            self.start(node)

    # -- invariants ----------------------------------------------------------------------
    def check(self) -> None:
        s = self.settings
        entry = self.backend.get(HEADER_KEY)
        if entry is not None:
            h = resolve(self.backend, Header.from_json(entry.value))
            if h.complete:
                ids = h.member_ids()
                assert len(set(ids)) == len(ids)
                assert s.min_nodes <= len(ids) <= s.max_nodes
        for rnd, results in self.finished.items():
            first = results[0][1].header.participants
            n = len(first)
            assert s.min_nodes <= n <= s.max_nodes, (rnd, first)
            assert len({m.node_id for m in first}) == n
            ranks = []
            for name, fin in results:
                assert fin.header.round == rnd
                assert fin.header.participants == first, "members disagree on the participants"
                assert first[fin.rank].node_id == name
                ranks.append(fin.rank)
            assert len(set(ranks)) == len(ranks), "two nodes got the same group rank"
            assert set(ranks) <= set(range(n))
        for node in self.nodes:
            rounds = [f.header.round for f in node.results]
            assert rounds == sorted(set(rounds)), "a node finished the same round twice or went back"

    def alive(self) -> list[SimNode]:
        return [n for n in self.nodes if n.status in ("joining", "running", "idle")]

    def settle(self, iterations: int = 400) -> None:
        """Fair schedule: every live node heartbeats, steps and polls; the clock moves on."""
        for node in self.alive():
            if node.status == "idle":
                self.start(node)
        for _ in range(iterations):
            for node in self.alive():
                self.heartbeat(node)
                self.step(node)
                self.agent_poll(node)
                self.check()
            self.now += 0.25
            if not self.alive():
                return
            if all(n.status == "running" for n in self.alive()):
                h = read_header(self.backend)[0]
                if h.complete and {n.name for n in self.alive()} == set(h.member_ids()):
                    return


KINDS = (
    ["step"] * 8
    + ["stepall"] * 4
    + ["hb"] * 3
    + ["tick"] * 3
    + ["poll"] * 2
    + ["crash", "restart", "restart", "rejoin", "leave", "start"]
)
EVENTS = st.tuples(st.sampled_from(KINDS), st.integers(0, 5), st.sampled_from([0.1, 0.5, 1.0, 2.5, 5.0]))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, int, int, list[tuple[str, int, float]]]:
    n = draw(st.integers(2, 6))
    lo = draw(st.integers(1, n))
    hi = draw(st.integers(lo, n + 1))
    events = draw(st.lists(EVENTS, min_size=10, max_size=150))
    return n, lo, hi, events


def run_events(sim: Sim, events: list[tuple[str, int, float]]) -> None:
    n = len(sim.nodes)
    for node in sim.nodes:  # agents start by asking for a round
        sim.start(node)
    for kind, arg, dt in events:
        if kind == "tick":
            sim.now += dt
            continue
        if kind == "stepall":
            for node in list(sim.nodes):
                sim.heartbeat(node)
                sim.step(node)
            sim.check()
            continue
        i = arg % n
        node = sim.nodes[i]
        if kind == "start" or kind == "rejoin":
            sim.start(node)
        elif kind == "step":
            sim.step(node)
        elif kind == "hb":
            sim.heartbeat(node)
        elif kind == "crash":
            sim.crash(node)
        elif kind == "restart":
            sim.restart(i)
        elif kind == "poll":
            sim.agent_poll(node)
        elif kind == "leave":
            sim.leave(node)
        sim.check()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_schedules_keep_rounds_consistent(scenario: tuple[int, int, int, list[tuple[str, int, float]]]) -> None:
    n, lo, hi, events = scenario
    sim = Sim(n, lo, hi)
    run_events(sim, events)
    sim.check()
    event(f"rounds completed: {min(len(sim.finished), 3)}")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_live_nodes_eventually_agree(scenario: tuple[int, int, int, list[tuple[str, int, float]]]) -> None:
    """After any schedule, a fair run brings every live node into one round (when min <= live <= max)."""
    n, lo, hi, events = scenario
    sim = Sim(n, lo, hi)
    run_events(sim, events)
    live = sim.alive()
    sim.settle()
    sim.check()
    if lo <= len(live) <= hi:
        h = read_header(sim.backend)[0]
        assert h.complete
        assert set(h.member_ids()) == {node.name for node in live}
        for node in live:
            assert node.status == "running"
            assert node.results[-1].header == h


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.data())
def test_close_reaches_everyone(n: int, data: st.DataObject) -> None:
    sim = Sim(n, 1, n)
    run_events(sim, data.draw(st.lists(EVENTS, max_size=30)))
    closer = data.draw(st.sampled_from(sim.alive())) if sim.alive() else None
    if closer is None:
        return
    sim.close(closer)
    for node in sim.alive():
        sim.start(node)
        sim.step(node)
        assert node.status == "closed"


def test_crashed_member_is_replaced_by_a_new_round() -> None:
    sim = Sim(3, 2, 3)
    sim.settle()
    first = read_header(sim.backend)[0]
    assert first.complete
    assert len(first.participants) == 3
    sim.crash(sim.nodes[1])
    sim.settle()
    h = read_header(sim.backend)[0]
    assert h.round > first.round
    assert h.member_ids() == ["n0", "n2"]
    assert "no heartbeat" in h.reason or "left" in h.reason


def test_restart_with_same_identity_forces_new_round() -> None:
    sim = Sim(2, 2, 2)
    sim.settle()
    round0 = read_header(sim.backend)[0]
    sim.crash(sim.nodes[0])
    sim.restart(0)
    sim.settle()
    h = read_header(sim.backend)[0]
    assert h.round > round0.round
    assert set(h.member_ids()) == {"n0", "n1"}
    assert h.participants[0].incarnation != round0.participants[0].incarnation or h.participants[0].node_id != "n0"


def test_last_call_waits_then_completes_with_min() -> None:
    sim = Sim(3, 2, 3)
    a, b, _ = sim.nodes
    for node in (a, b):
        sim.start(node)
    for _ in range(4):
        sim.step(a)
        sim.step(b)
    assert a.status == b.status == "joining"
    sim.now += TIMEOUTS.last_call - 0.5
    sim.step(a)
    assert a.status == "joining"
    sim.now += 0.5
    for _ in range(4):
        sim.step(a)
        sim.step(b)
    assert a.status == b.status == "running"
    assert a.results[-1].header.member_ids() == ["n0", "n1"]


def test_max_completes_without_last_call() -> None:
    sim = Sim(2, 1, 2)
    for node in sim.nodes:
        sim.start(node)
    for _ in range(4):
        for node in sim.nodes:
            sim.step(node)
    assert [n.status for n in sim.nodes] == ["running", "running"]
    assert sim.now == 0.0


def test_late_node_waits_and_is_counted() -> None:
    sim = Sim(3, 2, 3)
    a, b, c = sim.nodes
    for node in (a, b):
        sim.start(node)
    for _ in range(4):
        sim.step(a)
        sim.step(b)
    sim.now += TIMEOUTS.last_call
    for _ in range(4):
        sim.step(a)
        sim.step(b)
    assert a.status == "running"
    sim.start(c)
    for _ in range(3):
        sim.step(c)
    assert c.status == "joining"
    h = read_header(sim.backend)[0]
    nxt = sim.backend.get(f"round/count/{h.round + 1}")
    assert nodes_waiting(a.io.machine.last_round or 0, h, nxt.value, 3) == 1
    sim.settle()
    assert {n.status for n in sim.nodes} == {"running"}
    assert len(sim.nodes[0].results[-1].header.participants) == 3


def test_heartbeat_liveness_uses_observer_clock_only() -> None:
    from rallypoint.rendezvous.state import LivenessTracker

    tr = LivenessTracker(timeout=5)
    tr.observe("p", {"seq": 1, "time": 10**12}, now=100.0)  # a peer's "timestamp" is never read
    assert not tr.is_dead("p", 104.9)
    assert tr.is_dead("p", 105.0)
    tr.observe("p", {"seq": 2, "time": 0}, now=105.0)
    assert not tr.is_dead("p", 109.0)


def test_cas_header_is_the_only_way_to_complete() -> None:
    sim = Sim(2, 2, 2)
    for node in sim.nodes:
        sim.start(node)
    actions = []
    for _ in range(6):
        for node in sim.nodes:
            action, _ = node.io.decide(sim.now)
            actions.append(action)
            if not isinstance(action, Wait | Finished):
                node.io.apply(action)
    completes = [a for a in actions if isinstance(a, CasHeader) and a.header.complete]
    assert completes, actions


# -- wake-ups ---------------------------------------------------------------------------------

#: Checks far away: any progress below must come from wake-ups, never from a periodic check.
WAKE_TIMEOUTS = RendezvousTimeouts(
    join=10_000, last_call=0.5, close=10, heartbeat_interval=100.0, heartbeat_timeout=400.0
)


class WatchingSim(Sim):
    """Nodes honour :class:`Wait` as the handler does.

    A node that got ``Wait`` steps again only when the round header moved from the version it
    stepped with, or when the clock reaches ``until``: a protocol that relies on a wake-up nobody
    sends leaves nodes asleep here.
    """

    def __init__(self, n: int, min_nodes: int, max_nodes: int) -> None:
        super().__init__(n, min_nodes, max_nodes)
        self.settings = Settings(min_nodes, max_nodes, WAKE_TIMEOUTS, "sim")
        self.nodes = [self._make(f"n{i}") for i in range(n)]
        self.asleep: dict[str, tuple[int | None, float]] = {}

    def step(self, node: SimNode) -> None:
        sleeping = self.asleep.get(node.name)
        if sleeping is not None:
            entry = self.backend.get(HEADER_KEY)
            if (None if entry is None else entry.version) == sleeping[0] and self.now < sleeping[1]:
                return
            del self.asleep[node.name]
        if node.status != "joining":
            return
        action, view = node.io.decide(self.now)
        if isinstance(action, Wait):
            self.asleep[node.name] = (view.header_version, action.until)
        elif isinstance(action, Finished):
            action = self.as_members_see_it(action)
            node.results.append(action)
            self.finished.setdefault(action.header.round, []).append((node.name, action))
            node.status = "running"
        elif not isinstance(action, Closed | TimedOut):
            node.io.apply(action)

    def quiesce(self) -> None:
        """Step every node until nothing moves (the clock stands still)."""

        def state() -> object:
            versions = {k: e.version for k, e in self.backend.list("").items()}
            return versions, [(n.status, self.asleep.get(n.name)) for n in self.nodes]

        for _ in range(20 * len(self.nodes) + 20):
            before = state()
            for node in self.nodes:
                self.step(node)
            self.check()
            if before == state():
                return
        raise AssertionError("the simulation did not settle")  # pragma: no cover


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.data())
def test_rounds_complete_through_wake_ups_alone(n: int, data: st.DataObject) -> None:
    """Joiners arrive in any interleaving; the round completes without waiting for a check.

    At ``max`` it completes with the clock standing still; between ``min`` and ``max`` it
    completes at ``last_call`` (far before the first periodic check): every waiter is woken.
    """
    lo = data.draw(st.integers(1, n), label="min")
    hi = data.draw(st.integers(lo, n + 2), label="max")
    sim = WatchingSim(n, lo, hi)
    arriving = data.draw(st.integers(1, n), label="arriving")
    nodes = sim.nodes[:arriving]
    schedule = data.draw(st.lists(st.sampled_from(range(arriving)), max_size=8 * arriving), label="schedule")
    for node in nodes:  # arrival and steps interleaved at random
        sim.start(node)
        for i in schedule[: data.draw(st.integers(0, len(schedule)))]:
            sim.step(nodes[i])
            sim.check()
    sim.quiesce()
    joined = min(arriving, hi)
    if arriving >= hi:
        entry = sim.backend.get(HEADER_KEY)
        assert entry is not None, "the round did not complete at max with the clock still"
        h = resolve(sim.backend, Header.from_json(entry.value))
        assert h.complete, "the round did not complete at max with the clock still"
        assert len(h.participants) == hi
    sim.now = WAKE_TIMEOUTS.last_call + 0.01
    sim.quiesce()
    entry = sim.backend.get(HEADER_KEY)
    if arriving < lo:
        assert entry is None or not resolve(sim.backend, Header.from_json(entry.value)).complete
        return
    assert entry is not None
    h = resolve(sim.backend, Header.from_json(entry.value))
    assert h.complete
    assert len(h.participants) == joined
    members = set(h.member_ids())
    for node in nodes:
        if node.name in members:
            assert node.status == "running", f"{node.name} slept through the completion of its round"
            assert node.results[-1].header == h
