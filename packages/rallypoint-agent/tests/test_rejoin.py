"""A node cut off from the rendezvous for longer than heartbeat_timeout: dropped, then it rejoins by itself.

Two agents run in threads of this process on one in-memory rendezvous; node 1 reaches it through
:class:`Outage`, which fails every call with a backend error while the "link" is down. The
workers are small Python processes that record their starts (node, world size, restart count,
pid) and behave by world size, so that the test decides when the job may end.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent.agent import RESTARTS_KEY, AgentResult, AgentSettings, ElasticAgent
from rallypoint.agent.plan import NodeFacts, plan_job
from rallypoint.agent.rejoin import Lost, RejoinTimedOut, lost_contact, rejoin
from rallypoint.core.config import load_job_config, resolve_config
from rallypoint.core.plugins import get_plugin_manager
from rallypoint.rendezvous.backend import Entry, JSONValue, RendezvousBackend, Version
from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousHeartbeatError, RendezvousStateError
from rallypoint.rendezvous.handler import RendezvousHandler
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

#: Heartbeats every 0.1 s, a node dead after 1 s; ``join`` is the rejoin's limit too.
FAST = RendezvousTimeouts(join=20, last_call=0.2, close=5, heartbeat_interval=0.1, heartbeat_timeout=1)
ENDPOINT = "'grpc' backend at 10.9.8.7:29400"

#: Records its start, then: world 2 ends once the file ``ok`` exists; world 1 ends at once when
#: WORLD1=finish, else runs until stopped.
WORKER = """
import json, os, sys, time
d = sys.argv[1]
with open(os.path.join(d, "starts.jsonl"), "a") as f:
    f.write(json.dumps({"node": os.environ["NODE"], "world": int(os.environ["WORLD_SIZE"]),
                        "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]), "pid": os.getpid(),
                        "round": int(os.environ["RALLYPOINT_ROUND"]),
                        "t": time.time()}) + "\\n")
while True:
    if os.environ["WORLD_SIZE"] == "2" and os.path.exists(os.path.join(d, "ok")):
        break
    if os.environ["WORLD_SIZE"] == "1" and os.environ.get("WORLD1") == "finish":
        break
    time.sleep(0.05)
"""


class Outage:
    """A backend whose calls fail with :class:`RendezvousBackendError` while :attr:`down` is set.

    Args:
        inner: the backend that answers when the link is up.
        error: the error type raised while it is down (a state error: the run's state is gone).
        only: fail only the calls on keys that start with this (``"hb/"``: heartbeats alone).
    """

    supports_ttl = True

    def __init__(
        self, inner: RendezvousBackend, error: type[Exception] = RendezvousBackendError, *, only: str = ""
    ) -> None:
        self.inner = inner
        self.run_id = inner.run_id
        self.error = error
        self.only = only  # fail only the calls on keys starting with this ("": every call)
        self.down = threading.Event()
        self.failed_calls = 0

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.down.is_set() and str(args[0]).startswith(self.only):
            self.failed_calls += 1
            time.sleep(0.02)  # a network error takes a moment
            raise self.error(f"rendezvous server 10.9.8.7:29400 is unreachable ({name}, injected)")
        return getattr(self.inner, name)(*args, **kwargs)

    def get(self, key: str) -> Entry | None:
        return self._call("get", key)  # type: ignore[no-any-return]

    def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
        return self._call("set", key, value, ttl=ttl)  # type: ignore[no-any-return]

    def compare_and_set(
        self, key: str, value: JSONValue, *, version: Version | None, ttl: float | None = None
    ) -> tuple[bool, Entry | None]:
        return self._call("compare_and_set", key, value, version=version, ttl=ttl)  # type: ignore[no-any-return]

    def add(self, key: str, amount: int = 1) -> int:
        return self._call("add", key, amount)  # type: ignore[no-any-return]

    def delete(self, key: str, *, version: Version | None = None) -> bool:
        return self._call("delete", key, version=version)  # type: ignore[no-any-return]

    def list(self, prefix: str) -> dict[str, Entry]:
        return self._call("list", prefix)  # type: ignore[no-any-return]

    def watch(self, key: str, *, version: Version | None, timeout: float) -> bool:
        return self._call("watch", key, version=version, timeout=min(timeout, 0.2))  # type: ignore[no-any-return]

    def watch_prefix(self, prefix: str, *, versions: Mapping[str, Version], timeout: float) -> bool:
        return self._call("watch_prefix", prefix, versions=versions, timeout=min(timeout, 0.2))  # type: ignore[no-any-return]

    def close(self) -> None:
        self.inner.close()


class Node:
    """One agent in a thread, its console and its result."""

    def __init__(self, agent: ElasticAgent, console: io.StringIO) -> None:
        self.agent = agent
        self.console = console
        self.result: AgentResult | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.agent.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def output(self) -> str:
        return self.console.getvalue()

    def wait(self, timeout: float = 60) -> AgentResult:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the agent did not end within {timeout:g}s:\n{self.output()}"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def start(
    backend: RendezvousBackend,
    i: int,
    tmp_path: Path,
    *,
    nodes: tuple[int, int],
    world1: str = "run",
    timeouts: RendezvousTimeouts = FAST,
) -> Node:
    handler = RendezvousHandler(backend, make_node(i), min_nodes=nodes[0], max_nodes=nodes[1], timeouts=timeouts)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    settings = AgentSettings(
        argv=[sys.executable, str(worker), str(tmp_path)],
        run_id=backend.run_id,
        host=f"host{i}",
        max_restarts=0,
        log_dir=tmp_path / f"logs{i}",
        worker_env={"NODE": f"node{i}", "WORLD1": world1},
        stop_grace=5,
        rendezvous_endpoint=ENDPOINT,
    )
    console = io.StringIO()
    return Node(ElasticAgent(handler, settings, console=console), console)


def starts(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(predicate: Callable[[], bool], what: str, nodes: list[Node], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        outputs = "\n".join(f"--- node{i}\n{n.output()}" for i, n in enumerate(nodes))
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s\n{outputs}"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def cut_node1_while_both_train(
    tmp_path: Path, world1: str, timeouts1: RendezvousTimeouts = FAST
) -> tuple[Outage, Node, Node, dict[str, Any]]:
    """Both nodes train in one round; then node 1's link goes down. Returns its last worker start."""
    run_id = f"rejoin-{uuid.uuid4().hex[:8]}"
    link = Outage(MemoryBackend(run_id))
    a = start(MemoryBackend(run_id), 0, tmp_path, nodes=(1, 2), world1=world1)
    b = start(link, 1, tmp_path, nodes=(1, 2), world1=world1, timeouts=timeouts1)
    wait_for(lambda: {s["node"] for s in starts(tmp_path) if s["world"] == 2} == {"node0", "node1"}, "world 2", [a, b])
    mine = [s for s in starts(tmp_path) if s["node"] == "node1"][-1]
    link.down.set()
    return link, a, b, mine


def test_a_node_cut_off_longer_than_heartbeat_timeout_rejoins_and_the_job_completes(tmp_path: Path) -> None:
    link, a, b, before = cut_node1_while_both_train(tmp_path, world1="run")
    cut = time.time()
    # node 0 drops node 1 and trains alone; node 1 notices and stops its workers
    wait_for(lambda: any(s["world"] == 1 and s["t"] > cut for s in starts(tmp_path)), "node 0 alone", [a, b])
    wait_for(lambda: "lost the rendezvous" in b.output(), "node 1 noticed", [a, b])
    assert not alive(before["pid"]), "node 1's worker of the round it was dropped from lingers"
    assert b.thread.is_alive(), f"node 1's agent ended instead of rejoining:\n{b.output()}"
    time.sleep(FAST.heartbeat_timeout)  # the link stays down a while longer: node 1 retries
    (tmp_path / "ok").touch()
    link.down.clear()
    healed = time.time()
    ra, rb = a.wait(), b.wait()
    out = a.output() + b.output()
    assert (ra.exit_code, rb.exit_code) == (0, 0), out
    assert (ra.restarts, rb.restarts, rb.rejoins) == (0, 0, 1), out
    assert MemoryBackend(link.run_id).get(RESTARTS_KEY) is None, "a restart was counted"
    assert "restarting the job" not in out
    line = next(line for line in b.output().splitlines() if "lost the rendezvous" in line)
    assert "its heartbeat could not reach the rendezvous ('grpc' backend at 10.9.8.7:29400)" in line, line
    assert "dropped from round" in line, line
    assert "its workers were stopped" in line, line
    assert "rejoining, no restart counted" in line, line
    assert "rejoined the job in round" in b.output()
    # the job grew back: both nodes' workers ran in a world of 2 after the link came back
    again = [s for s in starts(tmp_path) if s["t"] > healed]
    assert {(s["node"], s["world"], s["restart"]) for s in again} == {("node0", 2, 0), ("node1", 2, 0)}, out


def test_a_node_that_finds_its_round_reopened_without_it_rejoins(tmp_path: Path) -> None:
    """The link comes back before node 1's own heartbeat gave up, but node 0 dropped it meanwhile."""
    patient = RendezvousTimeouts(join=20, last_call=0.2, close=5, heartbeat_interval=0.1, heartbeat_timeout=30)
    link, a, b, before = cut_node1_while_both_train(tmp_path, world1="run", timeouts1=patient)
    cut = time.time()
    wait_for(lambda: any(s["world"] == 1 and s["t"] > cut for s in starts(tmp_path)), "node 0 alone", [a, b])
    link.down.clear()
    # node 1's worker of the old round still runs (world 2): "ok" is written only once node 1 has
    # seen that it was dropped, or that worker would finish "successfully" in a round that is over
    wait_for(lambda: "was dropped" in b.output(), "node 1 noticed it was dropped", [a, b])
    (tmp_path / "ok").touch()
    ra, rb = a.wait(), b.wait()
    out = a.output() + b.output()
    assert (ra.exit_code, rb.exit_code, ra.restarts, rb.restarts) == (0, 0, 0, 0), out
    assert "restarting the job" not in out
    line = next(line for line in b.output().splitlines() if "was dropped" in line)
    assert f"this node was dropped from round {before['round']} (no heartbeat from 'node1')" in line, line
    assert "no restart counted" in line, line
    assert not alive(before["pid"])
    assert {s["node"] for s in starts(tmp_path) if s["world"] == 2 and s["t"] > cut} == {"node0", "node1"}, out


def test_the_job_completes_while_the_node_is_cut_off_and_it_exits_0_saying_so(tmp_path: Path) -> None:
    link, a, b, _ = cut_node1_while_both_train(tmp_path, world1="finish")
    ra = a.wait()
    assert ra.exit_code == 0, a.output()
    wait_for(lambda: "lost the rendezvous" in b.output(), "node 1 noticed", [a, b])
    link.down.clear()
    rb = b.wait()
    out = b.output()
    assert rb.exit_code == 0, out
    assert rb.rejoins == 0
    assert "succeeded without this node" in out
    assert "its workers were stopped) and ran no worker in the rounds that finished the job" in out
    assert [s["node"] for s in starts(tmp_path) if s["world"] == 1] == ["node0"]


def test_a_node_whose_link_never_heals_fails_after_the_join_timeout_naming_the_endpoint(tmp_path: Path) -> None:
    short = RendezvousTimeouts(join=2, last_call=0, close=5, heartbeat_interval=0.1, heartbeat_timeout=1)
    run_id = f"never-{uuid.uuid4().hex[:8]}"
    link = Outage(MemoryBackend(run_id))
    node = start(link, 1, tmp_path, nodes=(1, 1), timeouts=short)
    wait_for(lambda: bool(starts(tmp_path)), "the worker started", [node])
    link.down.set()
    cut = time.monotonic()
    result = node.wait()
    took = time.monotonic() - cut
    out = node.output()
    assert result.exit_code == 1, out
    assert "lost the rendezvous" in out
    line = out.splitlines()[-1]
    assert "this node fails: it could not rejoin the job, the rendezvous ('grpc' backend at 10.9.8.7:29400)" in line
    assert "did not answer for 2." in line, line
    assert "join timeout 2s" in line, line
    assert "RendezvousBackendError: rendezvous server 10.9.8.7:29400 is unreachable" in line, line
    assert took < 1 + 2 + 3, f"took {took:.1f}s:\n{out}"  # heartbeat_timeout + join timeout + slack
    assert not alive(starts(tmp_path)[0]["pid"])


def test_a_node_whose_heartbeat_alone_cannot_be_written_fails_after_the_join_timeout(tmp_path: Path) -> None:
    """The backend answers everything but this node's heartbeat: no endless drop-and-rejoin cycle."""
    short = RendezvousTimeouts(join=2, last_call=0, close=5, heartbeat_interval=0.1, heartbeat_timeout=0.5)
    run_id = f"nobeat-{uuid.uuid4().hex[:8]}"
    link = Outage(MemoryBackend(run_id), only="hb/")
    node = start(link, 1, tmp_path, nodes=(1, 1), timeouts=short)
    wait_for(lambda: bool(starts(tmp_path)), "the worker started", [node])
    link.down.set()
    result = node.wait(timeout=30)
    out = node.output()
    assert result.exit_code == 1, out
    assert result.rejoins == 0, out
    assert len(starts(tmp_path)) == 1, f"the node ran workers again while its heartbeat failed:\n{out}"
    assert "this node fails: it could not rejoin the job" in out.splitlines()[-1], out


def test_a_rendezvous_whose_state_is_gone_fails_the_node_without_rejoining(tmp_path: Path) -> None:
    run_id = f"gone-{uuid.uuid4().hex[:8]}"
    link = Outage(MemoryBackend(run_id), error=RendezvousStateError)
    node = start(link, 1, tmp_path, nodes=(1, 1))
    wait_for(lambda: bool(starts(tmp_path)), "the worker started", [node])
    link.down.set()
    # the monitor's read raises the state error, or the heartbeat (which fails the node at once on
    # a state error) comes first and the agent ends with exit code 1, naming it: never a rejoin
    try:
        result = node.wait()
    except RendezvousStateError as exc:
        assert "10.9.8.7:29400 is unreachable (" in str(exc)  # noqa: PT017 - one of two right outcomes
    else:
        assert result.exit_code == 1, node.output()
        assert "this node fails, its workers were stopped" in node.output()
        assert "RendezvousStateError: rendezvous server 10.9.8.7:29400 is unreachable" in node.output()
    assert "rejoin" not in node.output()
    assert not alive(starts(tmp_path)[0]["pid"])


# -- the pieces ---------------------------------------------------------------------------------
def test_only_an_unreachable_backend_is_a_lost_contact() -> None:
    unreachable = RendezvousBackendError("down")
    assert lost_contact(unreachable)
    assert lost_contact(RendezvousHeartbeatError("n", "r", 3, 2.0, unreachable))
    assert not lost_contact(RendezvousHeartbeatError("n", "r", 3, 2.0, RendezvousStateError("gone")))
    assert not lost_contact(RendezvousStateError("gone"))


def test_rejoin_retries_with_backoff_until_the_join_timeout() -> None:
    now = [100.0]
    waits: list[float] = []

    class Io:
        def heartbeat(self) -> None:
            raise RendezvousBackendError("no route to host")

    class Unreachable:
        timeouts = RendezvousTimeouts(join=10, heartbeat_interval=3, heartbeat_timeout=10)
        io = Io()
        cleared = 0

        def clear_failure(self) -> None:
            self.cleared += 1

        def next_rendezvous(self) -> Any:
            raise RendezvousBackendError("no route to host")

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    handler = Unreachable()
    with pytest.raises(RejoinTimedOut) as info:
        rejoin(handler, Lost(0, 99.0, 100.0, "its workers were stopped"), clock=lambda: now[0], sleep=sleep)  # type: ignore[arg-type]
    # doubled up to the heartbeat interval, the last wait cut to the rest of the join timeout
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0, 0.5]
    assert (info.value.attempts, info.value.seconds, handler.cleared) == (7, 10.0, 7)
    assert str(info.value.error) == "no route to host"


def test_the_plan_names_the_rendezvous_endpoint(tmp_path: Path) -> None:
    pm = get_plugin_manager()
    (tmp_path / "train.py").write_text("pass\n")
    job = tmp_path / "job.toml"
    job.write_text(
        f'[job]\nentrypoint = "train.py"\n[rendezvous]\nbackend = "file"\n[rendezvous.options]\npath = "{tmp_path}"\n'
    )
    resolved = resolve_config(load_job_config(job, pm, environ={}), pm)
    facts = NodeFacts(host="node-a", pid=1, cwd=tmp_path, job_file=job)
    assert plan_job(resolved, facts).settings.rendezvous_endpoint == f"'file' backend at {tmp_path}"
    memory = tmp_path / "memory.toml"
    memory.write_text('[job]\nentrypoint = "train.py"\n')
    resolved = resolve_config(load_job_config(memory, pm, environ={}), pm)
    assert plan_job(resolved, facts).settings.rendezvous_endpoint == "'memory' backend"
