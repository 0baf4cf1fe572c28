"""Jobs across namespace hosts: each agent on its own "host" with its own address and host name.

The host name of every namespace host resolves to 127.0.0.1 inside it, as on many cloud images;
the agents are told their address with ``--local-addr``. The rendezvous is the file backend in a
directory every host sees (the namespaces share the file system, as hosts share an NFS mount).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import netns
import pytest

PY = sys.executable
CLI = [PY, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

ALL_REDUCE = """
import datetime, json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
seen = {k: os.environ.get(k) for k in ("RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                                       "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
seen["sum"] = t.item()
seen["host"] = os.uname().nodename
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
"""


@dataclass
class AgentRun:
    host: netns.Host
    returncode: int
    output: str


def agent_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "GLOO_", "NCCL_"))}
    env.update(extra)
    return env


def wait_joined(tmp_path: Path, run_id: str, count: int) -> None:
    """Wait until ``count`` nodes joined round 0 (``rallypoint status``), so arrival order is known."""
    if count == 0:
        return
    status = [*CLI, "status", "--rdzv-backend", "file", "--rdzv-endpoint", str(tmp_path / "rdzv"), "--run-id", run_id]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run(status, capture_output=True, text=True, timeout=60, env=agent_env()).stdout
        if f"joined:    {count}\n" in out:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} node(s) did not join {run_id!r}")


def run_on_hosts(
    net: netns.HostNetwork,
    tmp_path: Path,
    script: str,
    *,
    nproc: int = 1,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 150,
) -> list[AgentRun]:
    """One agent per host, all in one job; returns each agent's exit code and output.

    Agents start in host order, each after the previous one joined, so the first host is the
    rendezvous's group rank 0.
    """
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    procs = []
    run_id = f"mh-{tmp_path.name}"
    for i, host in enumerate(net.hosts):
        wait_joined(tmp_path, run_id, i)
        argv = [
            *CLI,
            "run",
            "--nnodes",
            str(len(net.hosts)),
            "--nproc-per-node",
            str(nproc),
            "--rdzv-backend",
            "file",
            "--rdzv-endpoint",
            str(tmp_path / "rdzv"),
            "--run-id",
            run_id,
            "--max-restarts",
            "0",
            "--local-addr",
            host.addr,
            *extra,
            str(path),
            str(out),
        ]
        procs.append(
            host.popen(
                argv,
                cwd=tmp_path,
                env=agent_env(**(env or {})),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    runs = []
    for host, proc in zip(net.hosts, procs, strict=True):
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        runs.append(AgentRun(host, proc.returncode, output))
    return runs


def results(tmp_path: Path, world: int) -> list[dict[str, object]]:
    return [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(world)]


def assert_all_ok(runs: list[AgentRun]) -> None:
    for run in runs:
        assert run.returncode == 0, f"agent on {run.host.name} exited {run.returncode}:\n{run.output[-4000:]}"


def test_gloo_job_across_two_hosts_uses_the_agents_interface(hosts, tmp_path: Path) -> None:
    net = hosts(2)
    runs = run_on_hosts(net, tmp_path, ALL_REDUCE, nproc=2)
    assert_all_ok(runs)
    seen = results(tmp_path, 4)
    assert {s["sum"] for s in seen} == {10.0}
    assert {s["host"] for s in seen} == {"nodea", "nodeb"}
    # Gloo (and NCCL's bootstrap) bind the interface that holds the agent's --local-addr
    assert {s["GLOO_SOCKET_IFNAME"] for s in seen} == {"eth0"}
    assert {s["NCCL_SOCKET_IFNAME"] for s in seen} == {"eth0"}


def test_a_socket_interface_the_user_set_is_kept(hosts, tmp_path: Path) -> None:
    net = hosts(2)
    runs = run_on_hosts(net, tmp_path, ALL_REDUCE, env={"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "lo"})
    assert_all_ok(runs)
    seen = results(tmp_path, 2)
    assert {s["GLOO_SOCKET_IFNAME"] for s in seen} == {"eth0"}
    assert {s["NCCL_SOCKET_IFNAME"] for s in seen} == {"lo"}


@pytest.mark.parametrize("rank0_host", ["nodea", "nodeb"])
def test_store_address_follows_global_rank_0_with_explicit_ranks(hosts, tmp_path: Path, rank0_host: str) -> None:
    net = hosts(2)
    other = "nodeb" if rank0_host == "nodea" else "nodea"
    mapping = ["--set", f'ranks.options.hosts={{ "{rank0_host}" = 0, "{other}" = 1 }}']
    runs = run_on_hosts(net, tmp_path, ALL_REDUCE, extra=("--set", "ranks.strategy=explicit", *mapping))
    assert_all_ok(runs)
    seen = results(tmp_path, 2)
    addr_of = {h.name: h.addr for h in net.hosts}
    assert seen[0]["host"] == rank0_host
    assert "group rank 0 runs" in runs[0].output  # nodea joined first
    # every worker was sent to the host where global rank 0 serves the store
    assert {s["MASTER_ADDR"] for s in seen} == {addr_of[rank0_host]}


def test_store_address_follows_global_rank_0_with_topology(hosts, tmp_path: Path) -> None:
    net = hosts(2)
    # whichever node the rendezvous made group rank 0, topology puts global rank 0 on nodeb
    labels = 'ranks.options.hosts={ nodea = "rack=r2", nodeb = "rack=r1" }'
    topology = ("--set", "ranks.strategy=topology", "--set", labels)
    runs = run_on_hosts(net, tmp_path, ALL_REDUCE, extra=(*topology, "--set", 'ranks.options.order=["rack"]'))
    assert_all_ok(runs)
    seen = results(tmp_path, 2)
    assert "group rank 0 runs" in runs[0].output  # nodea joined first
    assert seen[0]["host"] == "nodeb"
    assert {s["MASTER_ADDR"] for s in seen} == {net.hosts[1].addr}
