"""End to end: a standalone server killed and restarted mid-job; the job finishes untouched.

Two ``rallypoint run`` agents rendezvous on a standalone ``rallypoint rdzv serve --data-dir``.
While their gloo workers run, the server is SIGKILLed and started again on the same port and
data directory, well within ``heartbeat_timeout``. The agents ride it out: the job finishes in
round 0, each worker started once (no restart spent), and the agents exit 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import ServerProcess

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

WORKER = """
import json, os, sys, time
import torch, torch.distributed as dist
out = sys.argv[1]
rank = os.environ["RANK"]
dist.init_process_group("gloo")
t = torch.tensor([float(rank) + 1.0])
dist.all_reduce(t)
with open(os.path.join(out, f"r{os.environ['RALLYPOINT_ROUND']}.rank{rank}.{os.getpid()}"), "w") as f:
    json.dump({"WORLD_SIZE": os.environ["WORLD_SIZE"], "sum": t.item()}, f)
deadline = time.monotonic() + 300
while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)  # hold the round open until the test has restarted the server
dist.all_reduce(t)  # the workers' own store (not the rendezvous server) still works
dist.destroy_process_group()
"""


def _agents(tmp_path: Path, endpoint: str) -> list[subprocess.Popen[str]]:
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(WORKER))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    env["OMP_NUM_THREADS"] = "1"
    argv = [*RALLYPOINT, "run", "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1"]
    argv += ["--rdzv-backend", "grpc", "--rdzv-endpoint", endpoint, "--run-id", "restart-e2e"]
    argv += ["--local-addr", "127.0.0.1"]
    for setting in (
        "rendezvous.options.serve=never",
        "rendezvous.options.retry_timeout=30",
        "rendezvous.heartbeat_interval=0.25s",
        "rendezvous.heartbeat_timeout=30s",
    ):
        argv += ["--set", setting]
    return [
        subprocess.Popen(
            [*argv, "--node-id", f"n{i}", str(worker), str(tmp_path)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]


def _until(cond: object, what: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.slow
def test_a_job_survives_a_standalone_server_restart_without_a_restart(
    start_server: type[ServerProcess], tmp_path: Path
) -> None:
    data = tmp_path / "rdzv-data"
    server = start_server("--data-dir", str(data))
    agents = _agents(tmp_path, server.address)
    try:
        _until(lambda: len(list(tmp_path.glob("r0.rank*"))) == 2, "both workers of round 0 ran a collective")
        server.kill()
        time.sleep(1.0)  # down for a second: agents' heartbeats and status reads fail meanwhile
        server = start_server("--data-dir", str(data), port=server.port)
        time.sleep(1.0)  # several heartbeat intervals against the restarted server
        (tmp_path / "go").write_text("")
        results = [a.communicate(timeout=180) for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], results
    runs = sorted(p.name.split(".")[0] + "." + p.name.split(".")[1] for p in tmp_path.glob("r*.rank*"))
    assert runs == ["r0.rank0", "r0.rank1"], f"a worker was restarted or a new round opened: {runs}"
    seen = [json.loads(p.read_text()) for p in tmp_path.glob("r0.rank*")]
    assert seen == [{"WORLD_SIZE": "2", "sum": 3.0}] * 2
