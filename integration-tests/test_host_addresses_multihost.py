"""Hosts whose own name resolves to 127.0.0.1 (as on many cloud images) need no flag.

On the namespace hosts every host's ``/etc/hosts`` maps its own name to 127.0.0.1 and the other
hosts' names to their addresses. Without ``--local-addr`` an agent finds the address other hosts
reach it at (the interface that reaches the rendezvous endpoint, or the host's one address
besides loopback) and gives it to the workers (``MASTER_ADDR`` where it holds the store) and to
Gloo (``GLOO_SOCKET_IFNAME``); a gRPC endpoint named by host name is served on that address.
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
out = {"sum": t.item(), "host": os.uname().nodename, "MASTER_ADDR": os.environ["MASTER_ADDR"],
       "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME")}
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


def _run(net, tmp_path: Path, backend: str, endpoint: str) -> list[dict[str, object]]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(ALL_REDUCE))
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "GLOO_", "NCCL_"))}
    procs = []
    for host in net.hosts:  # no --local-addr
        argv = [*CLI, "run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", backend,
                "--rdzv-endpoint", endpoint, "--run-id", "names", "--max-restarts", "0",
                "--set", "rendezvous.join_timeout=60s", str(script), str(out)]  # fmt: skip
        procs.append(
            host.popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        outputs.append(output)
    assert [p.returncode for p in procs] == [0, 0], outputs
    for output in outputs:  # each agent says which address it took, and why
        assert "resolves to loopback" in output, output
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_shared_directory_rendezvous_between_hosts_named_for_loopback(hosts, tmp_path: Path) -> None:
    net = hosts(2)
    seen = _run(net, tmp_path, "file", str(tmp_path / "rdzv"))
    assert {s["sum"] for s in seen} == {3.0}
    addresses = {h.addr for h in net.hosts}
    assert {s["MASTER_ADDR"] for s in seen} <= addresses  # an address the other host reaches
    assert {s["GLOO_SOCKET_IFNAME"] for s in seen} == {"eth0"}


def test_a_grpc_endpoint_given_by_host_name(hosts, tmp_path: Path) -> None:
    net = hosts(2)
    seen = _run(net, tmp_path, "grpc", f"{net.hosts[0].name}:29558")
    assert {s["sum"] for s in seen} == {3.0}
    assert {s["host"] for s in seen} == {h.name for h in net.hosts}
    assert {s["MASTER_ADDR"] for s in seen} <= {h.addr for h in net.hosts}
