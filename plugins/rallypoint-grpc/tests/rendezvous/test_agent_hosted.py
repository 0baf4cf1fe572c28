"""End to end: ``rallypoint run`` agents rendezvous on a server that one of them hosts.

Three agents on loopback name the same ``--rdzv-endpoint 127.0.0.1:PORT``; the first to bind
serves. Workers run real gloo collectives.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

WORKER = """
import json, os, sys, time
import torch, torch.distributed as dist
out = sys.argv[1]
rnd = int(os.environ["RALLYPOINT_ROUND"])
rank = os.environ["RANK"]
dist.init_process_group("gloo")
t = torch.tensor([float(rank) + 1.0])
dist.all_reduce(t)
with open(os.path.join(out, f"r{rnd}.rank{rank}.{os.getpid()}"), "w") as f:
    json.dump({"WORLD_SIZE": os.environ["WORLD_SIZE"], "sum": t.item()}, f)
if rnd == 0 and len(sys.argv) > 2:
    time.sleep(600)  # the first round runs until an agent dies
dist.destroy_process_group()
"""

FAST = [
    "--set",
    "rendezvous.heartbeat_interval=0.25s",
    "--set",
    "rendezvous.heartbeat_timeout=1.5s",
    "--set",
    "rendezvous.last_call_timeout=1s",
    "--set",
    "rendezvous.options.retry_timeout=0.5",
]


def free_port() -> int:
    """A free port below the kernel's ephemeral range.

    The agents bind it only seconds later. A port from the ephemeral range (what binding port 0
    gives) can meanwhile become the local end of any outgoing connection on the machine (other
    tests run in parallel); then no agent can serve and the job never starts. Users pick a fixed
    port (torchrun's 29400) for the same reason.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(20000, min(low, 32768))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")


def listener_inode(port: int) -> str | None:
    """The socket inode listening on ``port`` (from /proc/net/tcp and tcp6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                return fields[9]
    return None


def host_of(agents: list[subprocess.Popen[str]], port: int) -> subprocess.Popen[str]:
    """The agent whose process holds the listening socket."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        inode = listener_inode(port)
        for agent in agents:
            fds = Path(f"/proc/{agent.pid}/fd")
            try:
                links = [os.readlink(fd) for fd in fds.iterdir()]
            except (FileNotFoundError, PermissionError):
                continue
            if inode is not None and f"socket:[{inode}]" in links:
                return agent
        time.sleep(0.05)
    raise AssertionError(f"no agent listens on port {port}")


def start_agents(
    tmp_path: Path, run_id: str, nnodes: str, port: int, *args: str, flags: tuple[str, ...] = ()
) -> list[subprocess.Popen[str]]:
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(WORKER))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    env["OMP_NUM_THREADS"] = "1"
    common = [
        "run",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "grpc",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--run-id",
        run_id,
        "--local-addr",
        "127.0.0.1",
    ]
    return [
        subprocess.Popen(
            [*RALLYPOINT, *common, *FAST, *flags, "--node-id", f"n{i}", str(worker), str(tmp_path), *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]


def wait_for_files(tmp_path: Path, pattern: str, n: int, agents: list[subprocess.Popen[str]]) -> None:
    """Wait for ``n`` workers' files; on a timeout, fail with what every agent printed."""
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob(pattern))) < n:
        if time.monotonic() > deadline:
            for agent in agents:
                agent.kill()
            said = "\n".join(
                f"--- agent {i} (exit {a.wait()}):\n{a.communicate()[1][-3000:]}" for i, a in enumerate(agents)
            )
            raise AssertionError(f"fewer than {n} files {pattern} within 90 s\n{said}")
        time.sleep(0.05)


@pytest.mark.slow
def test_three_agents_run_a_gloo_job_on_the_agent_hosted_server(tmp_path: Path) -> None:
    port = free_port()
    agents = start_agents(tmp_path, "hosted", "3", port)
    try:
        results = [a.communicate(timeout=120) for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0, 0], results
    seen = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("r0.rank*"))]
    assert seen == [{"WORLD_SIZE": "3", "sum": 6.0}] * 3


@pytest.mark.slow
def test_a_killed_non_host_agent_leaves_the_others_to_finish(tmp_path: Path) -> None:
    port = free_port()
    agents = start_agents(tmp_path, "nonhost", "2:3", port, "hold")
    try:
        wait_for_files(tmp_path, "r0.rank*", 3, agents)
        host = host_of(agents, port)
        victim = next(a for a in agents if a is not host)
        victim.kill()
        survivors = [a for a in agents if a is not victim]
        results = [a.communicate(timeout=120) for a in survivors]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in survivors] == [0, 0], results
    later = [json.loads(p.read_text()) for p in tmp_path.glob("r*.rank*") if not p.name.startswith("r0.")]
    assert later == [{"WORLD_SIZE": "2", "sum": 3.0}] * 2


@pytest.mark.slow
def test_a_killed_host_agent_fails_the_others_at_once_naming_it(tmp_path: Path) -> None:
    """The rendezvous lived in the killed agent (no data_dir): the others fail, naming its host.

    They used to retry it for the whole join timeout (600 s by default) although no agent could
    bring the job's state back.
    """
    port = free_port()
    agents = start_agents(tmp_path, "host", "2:3", port, "hold", flags=("--set", "rendezvous.join_timeout=60s"))
    try:
        wait_for_files(tmp_path, "r0.rank*", 3, agents)
        host = host_of(agents, port)
        host.kill()
        killed_at = time.monotonic()
        others = [a for a in agents if a is not host]
        results = [a.communicate(timeout=120) for a in others]
        elapsed = time.monotonic() - killed_at
    finally:
        for a in agents:
            a.kill()
    for agent, (_, err) in zip(others, results, strict=True):
        assert agent.returncode == 1, err
        # One line says why the node ends: the agent that served the rendezvous is gone.
        errors = [line for line in err.splitlines() if "this node fails" in line]
        assert len(errors) == 1, err
        assert "the rendezvous was served by the agent on 127.0.0.1" in errors[0], err
        assert f"127.0.0.1:{port}" in errors[0], err
        assert "rendezvous.options.data_dir" in errors[0], err  # and how to make a job outlive it
        assert "Traceback" not in err, err
    # heartbeat_timeout (1.5 s) to fence, as long again for the server to come back, each call
    # retrying 0.5 s; stopping the workers adds a little. Not the join timeout (60 s here).
    assert elapsed < 15, f"the others took {elapsed:.1f}s to fail"
