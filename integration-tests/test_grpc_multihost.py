"""The grpc rendezvous across namespace hosts: nothing shared but the network.

Each agent runs in its own network namespace with its own address; the endpoint is the first
host's address, so that host's agent serves (bound to that address only) and the other connects.
No rendezvous directory exists: the job finds itself through the network alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

CLI = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

ALL_REDUCE = """
import datetime, json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"sum": t.item(), "host": os.uname().nodename}, f)
dist.destroy_process_group()
"""


def test_two_hosts_run_a_job_on_the_agent_hosted_grpc_server(hosts, tmp_path: Path) -> None:
    net = hosts(2)
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(ALL_REDUCE))
    out = tmp_path / "out"
    out.mkdir()
    endpoint = f"{net.hosts[0].addr}:29555"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "GLOO_", "NCCL_"))}
    procs = []
    for host in net.hosts:
        argv = [*CLI, "run", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "grpc",
                "--rdzv-endpoint", endpoint, "--run-id", "grpc-mh", "--max-restarts", "0",
                "--local-addr", host.addr, str(script), str(out)]  # fmt: skip
        procs.append(
            host.popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        outputs.append(output)
    assert [p.returncode for p in procs] == [0, 0], outputs
    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    assert {s["sum"] for s in seen} == {10.0}
    assert {s["host"] for s in seen} == {h.name for h in net.hosts}
    assert not (tmp_path / "rdzv").exists()


def test_an_agent_started_long_before_the_one_that_serves_waits_for_it(hosts, tmp_path: Path) -> None:
    """Start order does not matter: an agent waits for the server up to the join timeout.

    The agent on the second host starts, and its first call fails after the client's retry_timeout
    (5 s): the serving agent starts only once it has said so. It used to exit 1 at its first call,
    leaving the hosting agent waiting for it for the whole join timeout. (The order is set by that
    line, not by a sleep: on a loaded machine the early agent's start-up alone can take longer.)
    """
    import threading

    net = hosts(2)
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(ALL_REDUCE))
    out = tmp_path / "out"
    out.mkdir()
    endpoint = f"{net.hosts[0].addr}:29556"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "GLOO_", "NCCL_"))}

    def start(host) -> subprocess.Popen[str]:
        argv = [*CLI, "run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "grpc",
                "--rdzv-endpoint", endpoint, "--run-id", "grpc-late", "--max-restarts", "0",
                "--local-addr", host.addr, str(script), str(out)]  # fmt: skip
        return host.popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    early = start(net.hosts[1])
    early_lines: list[str] = []
    waiting = threading.Event()

    def read_early() -> None:
        assert early.stdout is not None
        for line in early.stdout:
            early_lines.append(line)
            if "does not answer yet" in line:
                waiting.set()

    reader = threading.Thread(target=read_early, daemon=True)
    reader.start()
    if not waiting.wait(timeout=90):
        early.kill()
        reader.join(timeout=10)
        raise AssertionError("the early agent never said it waits for the server:\n" + "".join(early_lines))
    assert early.poll() is None, "".join(early_lines)
    server = start(net.hosts[0])
    outputs = []
    for proc in (early, server):
        try:
            if proc is early:
                proc.wait(timeout=120)
                reader.join(timeout=10)
                output = "".join(early_lines)
            else:
                output, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            reader.join(timeout=10)
            output = "".join(early_lines) if proc is early else proc.communicate()[0]
        outputs.append(output)
    assert [early.returncode, server.returncode] == [0, 0], outputs
    assert "does not answer yet" in outputs[0], outputs[0]  # it said what it waits for, once
    assert outputs[0].count("does not answer yet") == 1, outputs[0]
    assert "reached the rendezvous after waiting" in outputs[0], outputs[0]
    assert {json.loads((out / f"rank{r}.json").read_text())["sum"] for r in range(2)} == {3.0}
