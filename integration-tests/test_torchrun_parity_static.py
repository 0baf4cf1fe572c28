"""torchrun's static rendezvous across two namespace hosts: ``--node-rank --master-addr --master-port``.

Each node is told its rank and the master's address, as with torchrun; nothing else is shared.
The master address is the host of node rank 1 here, which serves the rendezvous and is started
first, so it usually arrives first: its workers' global rank 1 shows that ranks come from
``--node-rank``, not from the order of arrival.
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
    json.dump({"sum": t.item(), "host": os.uname().nodename, "group_rank": os.environ["GROUP_RANK"]}, f)
dist.destroy_process_group()
"""


def test_static_rendezvous_on_two_hosts_takes_ranks_from_node_rank(hosts, tmp_path: Path) -> None:
    net = hosts(2)
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(ALL_REDUCE))
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "GLOO_", "NCCL_"))}
    procs = {}
    for node_rank in (1, 0):  # node rank N on host 1-N; host 0 (node rank 1) serves and arrives first
        host = net.hosts[1 - node_rank]
        argv = [*CLI, "run", "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node_rank),
                "--master_addr", net.hosts[0].addr, "--master_port", "29556", "--max_restarts", "0",
                "--local_addr", host.addr, str(script), str(out)]  # fmt: skip
        procs[node_rank] = host.popen(
            argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    outputs = {}
    for node_rank, proc in procs.items():
        try:
            outputs[node_rank], _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.kill()
            outputs[node_rank], _ = proc.communicate()
    assert [procs[r].returncode for r in (0, 1)] == [0, 0], outputs
    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [s["sum"] for s in seen] == [3.0, 3.0]
    assert [s["host"] for s in seen] == [net.hosts[1].name, net.hosts[0].name]  # global ranks follow --node-rank
    # GROUP_RANK is --node-rank, as under torchrun (host 0, node rank 1, arrives first)
    assert [s["group_rank"] for s in seen] == ["0", "1"]
