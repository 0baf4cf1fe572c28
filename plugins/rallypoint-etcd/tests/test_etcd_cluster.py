"""A three-member etcd cluster on loopback: the backend and a job survive a leader change."""

from __future__ import annotations

import json
import subprocess
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint_etcd.backend import EtcdBackend
from rallypoint_etcd.options import EtcdOptions
from rallypoint_etcd.testing import EtcdCluster

from .test_etcd_run import GLOO_JOB, RALLYPOINT, agent_env, wait_for


@pytest.fixture
def job(tmp_path: Path) -> Path:
    body = tmp_path / "job.py"
    body.write_text(textwrap.dedent(GLOO_JOB))
    return body


@pytest.fixture
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(3) as c:
        yield c


def _new_leader(cluster: EtcdCluster, old: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cluster.leader() is not old:
                return
        except RuntimeError:
            pass
        assert time.monotonic() < deadline, "the cluster elected no new leader"
        time.sleep(0.1)


@pytest.mark.slow
def test_the_backend_survives_a_leader_change(cluster: EtcdCluster) -> None:
    opts = EtcdOptions(endpoints=cluster.endpoints, namespace=f"lc-{uuid.uuid4().hex[:6]}", retry_timeout=20)
    a, b = EtcdBackend("lead", opts), EtcdBackend("lead", opts)
    v = a.set("k", 0)
    woke: list[bool] = []
    watcher = threading.Thread(target=lambda: woke.append(a.watch("k", version=v, timeout=60)))
    watcher.start()
    leader = cluster.leader()
    leader.stop()
    _new_leader(cluster, leader)
    # writes, transactions and reads go on through the other members
    assert b.add("n", 1) == 1
    ok, entry = b.compare_and_set("k", 1, version=v)
    assert ok
    assert entry is not None
    watcher.join(60)
    assert woke == [True], "the watch did not see the write made after the leader change"
    for i in range(20):
        assert a.add("n", 1) == i + 2
    got = a.get("k")
    assert got is not None
    assert got.value == 1


@pytest.mark.slow
def test_a_job_survives_a_leader_change_without_a_restart(cluster: EtcdCluster, job: Path, tmp_path: Path) -> None:
    args = [
        "run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        ",".join(cluster.endpoints),
        "--run-id",
        "leader",
        "--local-addr",
        "127.0.0.1",
        "--set",
        "rendezvous.heartbeat_interval=0.5s",
        "--set",
        "rendezvous.heartbeat_timeout=10s",
    ]
    agents = [
        subprocess.Popen(
            [*RALLYPOINT, *args, "--node-id", f"n{i}", str(job), str(tmp_path), "go"],
            cwd=tmp_path,
            env=agent_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        wait_for(tmp_path, "r0.rank*", 2)
        leader = cluster.leader()
        leader.stop()
        _new_leader(cluster, leader)
        time.sleep(1)  # heartbeats and status reads go through the new leader
        (tmp_path / "go").write_text("")
        results = [a.communicate(timeout=240) for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], results
    written = sorted(p.name.split(".")[0] for p in tmp_path.glob("r*.rank*"))
    assert written == ["r0", "r0"], "the leader change made the job re-rendezvous"
    for p in tmp_path.glob("r0.rank*"):
        assert json.loads(p.read_text())["restarts"] == "0"
