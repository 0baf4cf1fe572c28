"""Whole jobs through ``rallypoint run`` on the etcd backend: real agents, a real etcd, gloo workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint_etcd.client import EtcdClient
from rallypoint_etcd.options import EtcdOptions
from rallypoint_etcd.testing import EtcdServer

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

#: One all-reduce per round; with ``hold``, round 0 then waits (for a node to die, or for ``go``).
GLOO_JOB = """
import json, os, sys, time
import torch
import torch.distributed as dist

out, mode = sys.argv[1], sys.argv[2]
rnd = int(os.environ["RALLYPOINT_ROUND"])
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
seen = {"sum": t.item(), "world": dist.get_world_size(), "restarts": os.environ["TORCHELASTIC_RESTART_COUNT"]}
with open(os.path.join(out, f"r{rnd}.rank{rank}.{os.getpid()}"), "w") as f:
    json.dump(seen, f)
if rnd == 0 and mode == "hold":
    time.sleep(600)  # until a node dies and the round ends
if mode == "go":
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
dist.destroy_process_group()
"""


def agent_env() -> dict[str, str]:
    """This process's environment without RALLYPOINT_* overrides; one thread per worker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def etcd_job(server: EtcdServer, namespace: str, run_id: str, nnodes: str, *extra: str) -> list[str]:
    """``rallypoint run`` arguments of a job on loopback with the etcd backend."""
    return [
        "run",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        server.endpoint,
        "--run-id",
        run_id,
        "--local-addr",
        "127.0.0.1",
        "--set",
        f"rendezvous.options.namespace={namespace}",
        *extra,
    ]


def start_agents(args: list[str], body: Path, out: Path, mode: str, n: int) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [*RALLYPOINT, *args, "--node-id", f"n{i}", str(body), str(out), mode],
            cwd=out,
            env=agent_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]


def wait_for(out: Path, pattern: str, count: int, timeout: float = 180) -> list[Path]:
    deadline = time.monotonic() + timeout
    while len(found := sorted(out.glob(pattern))) < count:
        assert time.monotonic() < deadline, f"{count} x {pattern} not written within {timeout:g}s: {found}"
        time.sleep(0.05)
    return found


def run_keys(server: EtcdServer, namespace: str, run_id: str) -> dict[str, object]:
    """Every etcd key of the run (read straight from etcd)."""
    opts = EtcdOptions(endpoints=[server.endpoint], namespace=namespace)
    client = EtcdClient(opts)
    try:
        kvs, _ = client.get_prefix(opts.base_key(run_id))
        return dict(kvs)
    finally:
        client.close()


def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        out.add(pid)
    return out


@pytest.fixture
def job(tmp_path: Path) -> Path:
    body = tmp_path / "job.py"
    body.write_text(textwrap.dedent(GLOO_JOB))
    return body


@pytest.fixture
def namespace() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def own_etcd() -> Iterator[EtcdServer]:
    """A server of this test alone (the fault tests stop it)."""
    server = EtcdServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


FAST = [
    "--set",
    "rendezvous.heartbeat_interval=0.25s",
    "--set",
    "rendezvous.heartbeat_timeout=2s",
    "--set",
    "rendezvous.last_call_timeout=1s",
]


@pytest.mark.slow
def test_a_killed_agent_makes_the_survivors_regroup_and_finish(
    etcd_server: EtcdServer, job: Path, tmp_path: Path, namespace: str
) -> None:
    """Three agents run a gloo job on etcd; one is SIGKILLed; the other two regroup and finish."""
    agents = start_agents(etcd_job(etcd_server, namespace, "kill3", "2:3", *FAST), job, tmp_path, "hold", 3)
    try:
        first = wait_for(tmp_path, "r0.rank*", 3)
        assert {json.loads(p.read_text())["sum"] for p in first} == {6.0}  # 1 + 2 + 3 over gloo
        victim_pid = int(next(p for p in first if p.name.startswith("r0.rank2.")).name.split(".")[-1])
        victim = next(a for a in agents if a.pid in _ancestors(victim_pid))
        victim.kill()
        survivors = [a for a in agents if a is not victim]
        results = [a.communicate(timeout=240) for a in survivors]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in survivors] == [0, 0], results
    later = [p for p in tmp_path.glob("r*.rank*") if not p.name.startswith("r0.")]
    assert len(later) == 2, later
    for p in later:
        assert json.loads(p.read_text()) == {"sum": 3.0, "world": 2, "restarts": "0"}


@pytest.mark.slow
def test_keys_go_when_the_job_ends_and_the_run_id_can_be_used_again(
    etcd_server: EtcdServer, job: Path, tmp_path: Path, namespace: str
) -> None:
    for attempt in range(2):
        out = tmp_path / f"a{attempt}"
        out.mkdir()
        agents = start_agents(etcd_job(etcd_server, namespace, "again", "2", *FAST), job, out, "once", 2)
        results = [a.communicate(timeout=240) for a in agents]
        assert [a.returncode for a in agents] == [0, 0], results
        assert len(list(out.glob("r0.rank*"))) == 2
        # the last agent out of a closed run revoked the run's lease: nothing is left in etcd
        assert run_keys(etcd_server, namespace, "again") == {}


@pytest.mark.slow
def test_keys_of_killed_agents_expire_after_key_ttl(
    etcd_server: EtcdServer, job: Path, tmp_path: Path, namespace: str
) -> None:
    args = etcd_job(etcd_server, namespace, "ttl", "2", *FAST, "--set", "rendezvous.options.key_ttl=5")
    agents = start_agents(args, job, tmp_path, "hold", 2)
    try:
        wait_for(tmp_path, "r0.rank*", 2)
        assert run_keys(etcd_server, namespace, "ttl")
    finally:
        for a in agents:
            a.kill()
            a.communicate(timeout=30)
    killed = time.monotonic()
    while run_keys(etcd_server, namespace, "ttl"):
        assert time.monotonic() - killed < 30, "the run's keys outlived key_ttl (5 s) by far"
        time.sleep(0.2)
    out = tmp_path / "again"
    out.mkdir()
    agents = start_agents(etcd_job(etcd_server, namespace, "ttl", "2", *FAST), job, out, "once", 2)
    results = [a.communicate(timeout=240) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], results


def test_plugins_list_shows_the_backend(tmp_path: Path) -> None:
    result = subprocess.run(
        [*RALLYPOINT, "plugins", "list"], cwd=tmp_path, env=agent_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert ["etcd", "rallypoint-etcd", "0.1.0", "rendezvous", "backend:", "etcd"] in lines, result.stdout


def test_a_misspelt_backend_suggests_etcd(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("pass\n")
    result = subprocess.run(
        [*RALLYPOINT, "run", "--rdzv-backend", "etdc", "x.py"],
        cwd=tmp_path,
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "unknown rendezvous backend 'etdc'" in result.stderr
    assert "did you mean 'etcd'?" in result.stderr
    job_file = tmp_path / "job.toml"
    job_file.write_text('[rendezvous]\nbackend = "etdc"\n\n[job]\nentrypoint = "x.py"\n')
    result = subprocess.run(
        [*RALLYPOINT, "run", str(job_file)], cwd=tmp_path, env=agent_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "did you mean 'etcd'?" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_etcd_restarted_within_heartbeat_timeout_costs_no_restart(
    own_etcd: EtcdServer, job: Path, tmp_path: Path, namespace: str
) -> None:
    """etcd stops for about 2 s mid-job (heartbeat_timeout 8 s) and comes back on the same data."""
    slow = ["--set", "rendezvous.heartbeat_interval=0.5s", "--set", "rendezvous.heartbeat_timeout=8s"]
    args = etcd_job(own_etcd, namespace, "restart", "2", *slow, "--set", "rendezvous.options.retry_timeout=8")
    agents = start_agents(args, job, tmp_path, "go", 2)
    try:
        wait_for(tmp_path, "r0.rank*", 2)
        own_etcd.stop()
        time.sleep(2)  # the outage under test
        own_etcd.start()
        time.sleep(1)  # a heartbeat or two after the restart, then the workers finish
        (tmp_path / "go").write_text("")
        results = [a.communicate(timeout=240) for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], results
    written = sorted(p.name.split(".")[0] for p in tmp_path.glob("r*.rank*"))
    assert written == ["r0", "r0"], "the outage made the job re-rendezvous"
    for p in tmp_path.glob("r0.rank*"):
        assert json.loads(p.read_text())["restarts"] == "0"


@pytest.mark.slow
def test_etcd_gone_for_good_fails_each_agent_naming_the_endpoints(
    own_etcd: EtcdServer, job: Path, tmp_path: Path, namespace: str
) -> None:
    # an agent whose heartbeat fails stops its workers and tries to rejoin until the join timeout
    # (an outage shorter than that is ridden out, see test_faults_multihost): 15 s here
    args = etcd_job(
        own_etcd,
        namespace,
        "gone",
        "2",
        *FAST,
        "--set",
        "rendezvous.options.retry_timeout=2",
        "--set",
        "rendezvous.join_timeout=15s",
    )
    agents = start_agents(args, job, tmp_path, "go", 2)
    try:
        wait_for(tmp_path, "r0.rank*", 2)
        own_etcd.stop()
        stopped = time.monotonic()
        results = [a.communicate(timeout=240) for a in agents]
        elapsed = time.monotonic() - stopped
    finally:
        for a in agents:
            a.kill()
    for agent, (_, err) in zip(agents, results, strict=True):
        assert agent.returncode == 1, err
        assert "this node fails: it could not rejoin the job" in err, err
        assert "etcd unreachable" in err, err
        assert own_etcd.endpoint in err, err
        assert "Traceback" not in err, err
        assert "fork_posix" not in err, "gRPC's notes about forks reached the console"
    assert elapsed < 100, elapsed
