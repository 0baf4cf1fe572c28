"""rallypoint.rpc across real processes started with init_rpc (tcp:// store): shutdown, a dying owner."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rallypoint import rpc

from . import rpc_group as g

WORKER = Path(__file__).with_name("rpc_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(scenario: str, world: int, out: Path) -> list[subprocess.Popen[str]]:
    port = _free_port()
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), scenario, str(rank), str(world), str(port), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]


@pytest.mark.slow
def test_graceful_shutdown_waits_for_outstanding_work_on_every_worker(tmp_path: Path) -> None:
    procs = _start("graceful", 3, tmp_path)
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    # waiting in shutdown (ranks 0 and 2, 1.5 s) leaves nothing in the log: the store's client
    # logged two warnings at each second of it
    assert not [o for o in outputs if "waitForInput" in o], outputs
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert results[1]["done"] is True
    assert results[1]["value"] == "slow done"
    slow_end = float((tmp_path / "slow_end").read_text())
    # no worker left, rank 0 and the callee included, before rank 1's call to rank 2 had completed
    assert all(r["returned"] >= slow_end for r in results)


@pytest.mark.slow
def test_calls_to_an_owner_that_died_fail_naming_it(tmp_path: Path) -> None:
    procs = _start("owner_dies", 2, tmp_path)
    out0 = procs[0].communicate(timeout=180)[0]
    procs[1].communicate(timeout=60)
    assert procs[0].returncode == 0, out0
    assert procs[1].returncode == 3
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["before"] == "pong"
    assert result["die"] == "dying"
    assert result["pending"].startswith("WorkerUnavailable: worker worker1 (rank 1, 127.0.0.1:")
    assert "RRef" in result["pending"]
    assert result["to_here"].startswith("WorkerUnavailable: worker worker1")


@pytest.mark.slow
def test_a_graceful_shutdown_with_a_dead_peer_fails_naming_it_instead_of_hanging(tmp_path: Path) -> None:
    procs = _start("peer_dies", 2, tmp_path)
    out0 = procs[0].communicate(timeout=180)[0]
    procs[1].communicate(timeout=60)
    assert procs[0].returncode == 0, out0
    result = json.loads((tmp_path / "rank0.json").read_text())["shutdown"]
    assert result.startswith("WorkerUnavailable: worker worker1 (rank 1, 127.0.0.1:"), result
    assert "drained barrier of shutdown" in result


def test_init_rpc_alone_with_the_pickle_opt_in_warns(tmp_path: Path) -> None:
    options = rpc.RpcOptions(init_method=f"tcp://127.0.0.1:{_free_port()}", serializer="pickle", rpc_timeout=7)
    with pytest.warns(UserWarning, match="pickle serializer"):
        rpc.init_rpc("solo", rank=0, world_size=1, options=options)
    try:
        with pytest.raises(rpc.RpcError, match="twice"):
            rpc.init_rpc("again", rank=0, world_size=1, options=options)
        assert rpc.get_worker_info() == rpc.WorkerInfo("solo", 0)
        assert rpc.get_rpc_timeout() == 7
        assert rpc.rpc_sync("solo", g.identity, args=(tmp_path,)) == tmp_path  # pickled: opted in
        assert rpc.rpc_sync(0, g.add, args=(1, 2)) == 3
        rref = rpc.remote("solo", g.Counter, args=(1,))
        assert rref.is_owner()
        assert rref.rpc_sync().add(2) == 3
        assert rref.local_value().value == 3
    finally:
        rpc.shutdown()
    with pytest.raises(rpc.RpcError, match="not initialized"):
        rpc.rpc_sync("solo", g.add, args=(1, 2))


def test_init_rpc_errors_say_what_to_do() -> None:
    with pytest.raises(rpc.RpcError, match="invalid RPC worker name"):
        rpc.init_rpc("bad name", rank=0, world_size=1)
    with pytest.raises(rpc.RpcError, match="rallypoint run"):
        rpc.init_rpc("w", environ={})
    with pytest.raises(rpc.RpcError, match="MASTER_ADDR"):
        rpc.init_rpc("w", rank=0, world_size=1, options=rpc.RpcOptions(), environ={})
    port = _free_port()
    opts = rpc.RpcOptions(init_method=f"tcp://127.0.0.1:{port}", transport="carrier-pigeon", init_timeout=5)
    with pytest.raises(rpc.RpcError, match="unknown RPC transport 'carrier-pigeon'"):
        rpc.init_rpc("w", rank=0, world_size=1, options=opts)
