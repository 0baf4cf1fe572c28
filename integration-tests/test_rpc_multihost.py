"""rallypoint.rpc across namespace hosts: workers find each other through the job's store and serve
on the address that routes to it (see test_multihost.py for the hosts)."""

from __future__ import annotations

import json
from pathlib import Path

from test_multihost import assert_all_ok, run_on_hosts

RPC_JOB = """
import json, os, socket, sys
import torch
from rallypoint import rpc

@rpc.expose
def where():
    return os.uname().nodename

@rpc.expose
def echo(t):
    return t

@rpc.expose
class Box:
    def __init__(self, t):
        self.t = t
    def add(self, x):
        self.t = self.t + x
        return self.t

rank = int(os.environ["RANK"])
rpc.init_rpc(f"worker{rank}")
if rank == 0:
    box = rpc.remote("worker1", Box, args=(torch.ones(3),))
    big = torch.rand(1 << 20)
    out = {
        "callee_host": rpc.rpc_sync("worker1", where),
        "me": os.uname().nodename,
        "sum": box.rpc_sync().add(torch.ones(3)).tolist(),
        "owner": box.owner_name(),
        "big_ok": bool(torch.equal(rpc.rpc_sync("worker1", echo, args=(big,)), big)),
        "address": rpc.get_worker_info("worker1").address,
    }
    with open(os.path.join(sys.argv[1], "rpc.json"), "w") as f:
        json.dump(out, f)
rpc.shutdown()
"""


def test_rpc_between_two_hosts(hosts, tmp_path: Path) -> None:
    net = hosts(2)
    runs = run_on_hosts(net, tmp_path, RPC_JOB, nproc=1)
    assert_all_ok(runs)
    result = json.loads((tmp_path / "out" / "rpc.json").read_text())
    assert result["me"] == "nodea"
    assert result["callee_host"] == "nodeb"
    assert result["sum"] == [2.0, 2.0, 2.0]
    assert result["owner"] == "worker1"
    assert result["big_ok"] is True
    host_b = next(h for h in net.hosts if h.name == "nodeb")
    assert result["address"].startswith(f"{host_b.addr}:")  # served on nodeb's own address
