"""The agent's exit codes: a signal during rank computation, a spare node at the end (in-process)."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent.agent import ABORT_KEY, AgentSettings, ElasticAgent
from rallypoint.agent.ranks import RankAssignment, RankNode
from rallypoint.rendezvous.handler import RendezvousHandler
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.state import HEADER_KEY, Header, join_key
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

FAST = RendezvousTimeouts(join=20, last_call=0.1, close=5, heartbeat_interval=0.1, heartbeat_timeout=1)


class SignalledWhileAssigning:
    """A rank strategy during which the agent receives ``signum`` (a scheduler's SIGTERM, a Ctrl-C)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.calls = 0

    def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
        self.calls += 1
        os.kill(os.getpid(), self.signum)  # the agent's handler runs as soon as this returns
        raise AssertionError("the signal did not interrupt the rank computation")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_during_rank_computation_exits_128_plus_n(tmp_path: Path, signum: int) -> None:
    run_id = f"sig-{uuid.uuid4().hex[:8]}"
    backend = MemoryBackend(run_id, shared=False)
    handler = RendezvousHandler(backend, make_node(0), min_nodes=1, max_nodes=1, timeouts=FAST)
    strategy = SignalledWhileAssigning(signum)
    settings = AgentSettings(
        argv=[sys.executable, "-c", "raise SystemExit('no worker may start')"],
        run_id=run_id,
        host="testhost",
        log_dir=tmp_path,
        strategy=strategy,
        stop_grace=1,
    )
    console = io.StringIO()
    result = ElasticAgent(handler, settings, console=console).run()
    assert strategy.calls == 1
    assert result.exit_code == 128 + signum, console.getvalue()
    # a signal to one node is not a rank-assignment error: the job is not ended for the others
    assert backend.get(ABORT_KEY) is None
    header = backend.get(HEADER_KEY)
    # the node that completes the round runs the strategy (#38): the signal may stop it before the
    # complete header is written; either way the job is not closed
    assert header is None or not Header.from_json(header.value).closed
    assert not list(tmp_path.glob("attempt_*/rank_*.log")), "a worker started"


@pytest.mark.parametrize("failed", [False, True])
def test_a_node_that_waited_for_a_place_ends_the_way_the_job_did(tmp_path: Path, failed: bool) -> None:
    """A spare node (the job was full) never runs a worker; the close tells it how the job ended."""
    run_id = f"spare-{uuid.uuid4().hex[:8]}"
    member = RendezvousHandler(MemoryBackend(run_id), make_node(0), min_nodes=1, max_nodes=1, timeouts=FAST)
    spare = RendezvousHandler(MemoryBackend(run_id), make_node(1), min_nodes=1, max_nodes=1, timeouts=FAST)
    member.next_rendezvous()

    def close_once_the_spare_waits() -> None:
        deadline = time.monotonic() + 20
        while MemoryBackend(run_id).get(join_key(1, "node1")) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        reason = "job failed after 0 of 0 restart(s)" if failed else "job succeeded"
        member.set_closed(f"{reason} (closed by node 'node0')", failed=failed)

    closer = threading.Thread(target=close_once_the_spare_waits)
    closer.start()
    settings = AgentSettings(
        argv=[sys.executable, "-c", "raise SystemExit('no worker may start')"],
        run_id=run_id,
        host="spare",
        log_dir=tmp_path,
        max_restarts=0,
    )
    console = io.StringIO()
    try:
        result = ElasticAgent(spare, settings, console=console).run()
    finally:
        closer.join(timeout=30)
        member.shutdown()
    out = console.getvalue()
    assert result.rounds == 0
    if failed:
        assert result.exit_code == 1, out
        assert "job failed" in out
        assert "(closed by node 'node0'); this node's workers were stopped" in out
    else:
        assert result.exit_code == 0, out
        assert "ended (job succeeded (closed by node 'node0')) while this node waited for a place in it" in out
        assert "no worker ran here" in out
    assert not list(tmp_path.glob("attempt_*")), "a worker started"


TERM_RECORDER = """
import os, signal, sys, time
out = sys.argv[1]
def stop(signum, frame):
    with open(os.path.join(out, "term" + os.environ["RANK"]), "w") as f:
        f.write(signal.Signals(signum).name)
    raise SystemExit(0)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(out, "started" + os.environ["RANK"]), "w").close()
time.sleep(60)
"""


def test_a_signal_while_workers_start_stops_those_started_and_says_so(tmp_path: Path) -> None:
    """SIGTERM between two workers' starts (here: during rank 0's store head start).

    It escaped the attempt's handler: the agent exited 143 without saying why, and stopped the
    started worker only in its final clean-up.
    """
    run_id = f"sigstart-{uuid.uuid4().hex[:8]}"
    handler = RendezvousHandler(
        MemoryBackend(run_id, shared=False), make_node(0, local_world_size=2), min_nodes=1, max_nodes=1, timeouts=FAST
    )
    script = tmp_path / "worker.py"
    script.write_text(TERM_RECORDER)
    out = tmp_path / "out"
    out.mkdir()
    settings = AgentSettings(
        argv=[sys.executable, str(script), str(out)],
        run_id=run_id,
        host="testhost",
        log_dir=tmp_path / "logs",
        stop_grace=10,
        store_head_start=30,  # rank 1 would start 30 s after rank 0: the signal comes first
    )

    def signal_once_rank0_runs() -> None:
        deadline = time.monotonic() + 30
        while not (out / "started0").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=signal_once_rank0_runs)
    sender.start()
    console = io.StringIO()
    try:
        result = ElasticAgent(handler, settings, console=console).run()
    finally:
        sender.join(timeout=40)
    said = console.getvalue()
    assert result.exit_code == 128 + signal.SIGTERM, said
    assert "received SIGTERM; stopping workers" in said
    assert (out / "term0").read_text() == "SIGTERM"
    assert not (out / "started1").exists(), "rank 1 started after the signal"


class Recorder:
    """Stands in for the agent's debug service and console: records what the kill does, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.diagnosis: str | None = None

    def report_hang(self, why: str, say: Any) -> str:
        self.events.append("report")
        self.diagnosis = "ranks 0 wait in all_reduce #3"
        return self.diagnosis


def test_a_watchdog_kill_publishes_the_failure_dated_at_the_deadline_before_the_kill(tmp_path: Path) -> None:
    """The root cause of a watchdog kill is the expired worker, not the peers that lost it after the kill.

    Once the worker is killed its peers fail (their collective lost it), and the node that closes
    the job may print its report before the killed worker's own exit was seen and published. So
    its failure is published before the kill, dated at the timer's deadline (CI saw a peer named
    as the root cause of a watchdog kill on a loaded machine: the record came after the peer's,
    and was dated when the exit was observed).
    """
    from rallypoint.agent.logs import WorkerLogs
    from rallypoint.agent.ranks.model import WorkerRanks
    from rallypoint.agent.report import FailureReport, WorkerFailure
    from rallypoint.agent.restart_budget import FAILURES_PREFIX
    from rallypoint.agent.watchdog_kills import WatchdogKills
    from rallypoint.agent.workers import WorkerExit, WorkerGroup, WorkerSpec
    from rallypoint.core.records import BackendRecord
    from rallypoint.timer.watchdog_core import Expiry

    run_id = f"wd-{uuid.uuid4().hex[:8]}"
    backend = MemoryBackend(run_id, shared=False)
    handler = RendezvousHandler(backend, make_node(0), min_nodes=1, max_nodes=1, timeouts=FAST)
    settings = AgentSettings(argv=[sys.executable, "-c", "pass"], run_id=run_id, host="h", log_dir=tmp_path)
    agent = ElasticAgent(handler, settings, console=io.StringIO())
    debug = Recorder()
    published: list[WorkerFailure] = []

    def publish(failure: WorkerFailure) -> None:
        debug.events.append("publish")
        agent.budget.publish(failure)
        published.append(failure)

    record = BackendRecord(name="file")  # never started: on_expiry is called directly
    agent.attempts.kills = kills = WatchdogKills(record, None, debug, lambda line: None, publish)  # type: ignore[arg-type]
    logs = WorkerLogs(None)

    def ranks(rank: int) -> WorkerRanks:
        return WorkerRanks(node_id="n0", local_rank=rank, rank=rank, world_size=2, role="default", role_rank=rank,
                           role_world_size=2, local_world_size=2, group_rank=0, group_world_size=1)  # fmt: skip

    def failure_of(ex: WorkerExit) -> WorkerFailure:
        return agent.attempts.failure(ex, ranks(ex.rank), logs, tmp_path, 0, "n0")

    group = WorkerGroup()
    group.start([WorkerSpec(rank=1, argv=[sys.executable, "-c", "import time; time.sleep(60)"])])
    try:
        kills.follow(group, failure_of)
        pid = group.pids[1]
        now = time.time()
        kills.on_expiry(Expiry(pid=pid, rank=1, scope="data_load", deadline=now - 3.0, acquired_at=now - 4.0))
        exits = group.stop(grace=5)
    finally:
        group.stop(grace=0)
    assert debug.events == ["report", "publish"]  # gathered while the hang was there, published before the kill
    assert exits[1].signal_name == "SIGKILL"
    early = published[0]
    assert (early.rank, early.time, early.signal) == (1, now - 3.0, "SIGKILL")
    assert early.reason.startswith("watchdog timer 'data_load' expired after 1s, killed")
    assert early.reason.endswith("; hang ranks 0 wait in all_reduce #3")
    assert list(backend.list(FAILURES_PREFIX)) == [f"{FAILURES_PREFIX}0/n0/1"]
    # a peer that lost it fails after the kill, but its exit may be seen first: the killed worker is the root cause
    peer = failure_of(WorkerExit(0, 100, 1, now - 5, now - 0.5))
    killed = failure_of(exits[1])
    assert killed.time == now - 3.0
    assert peer.time == now - 0.5  # no timer expired: the time its exit was seen
    report = FailureReport.build(run_id, [peer, killed], restarts=0, max_restarts=0)
    assert report.root_cause is killed
