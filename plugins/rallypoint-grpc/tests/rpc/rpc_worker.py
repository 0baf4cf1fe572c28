"""A worker process of test_rpc_processes: ``python rpc_worker.py SCENARIO RANK WORLD PORT OUT``."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from rallypoint import rpc

OUT = Path(sys.argv[5]) if len(sys.argv) > 5 else Path(".")


def stamp(name: str) -> None:
    (OUT / f"{name}.{os.getpid()}").write_text(repr(time.monotonic()))


@rpc.expose
def slow(seconds: float) -> str:
    time.sleep(seconds)
    (OUT / "slow_end").write_text(repr(time.time()))
    return "slow done"


@rpc.expose
def die() -> str:
    threading.Timer(0.2, os._exit, (3,)).start()
    return "dying"


@rpc.expose
class Sleeper:
    def nap(self, seconds: float) -> str:
        time.sleep(seconds)
        return "rested"

    def ping(self) -> str:
        return "pong"


def graceful(rank: int) -> None:
    fut = None
    if rank == 1:
        fut = rpc.rpc_async("worker2", slow, args=(1.5,))
    rpc.shutdown()
    result = {"returned": time.time(), "done": fut.done() if fut else None, "value": fut.wait() if fut else None}
    (OUT / f"rank{rank}.json").write_text(json.dumps(result))


def owner_dies(rank: int) -> None:
    if rank != 0:
        time.sleep(60)  # killed by die() long before
        return
    rref = rpc.remote("worker1", Sleeper)
    result = {"before": rref.rpc_sync().ping()}
    pending = rref.rpc_async().nap(30)
    result["die"] = rpc.rpc_sync("worker1", die)
    for name, call in (("pending", pending.wait), ("to_here", lambda: rref.to_here(timeout=10))):
        try:
            call()
            result[name] = "no error"
        except rpc.RpcError as exc:
            result[name] = f"{type(exc).__name__}: {exc}"
    (OUT / "rank0.json").write_text(json.dumps(result))
    rpc.shutdown(graceful=False)


def peer_dies(rank: int) -> None:
    if rank == 1:
        os._exit(3)  # gone without shutdown
    try:
        rpc.shutdown()
        result = "no error"
    except rpc.RpcError as exc:
        result = f"{type(exc).__name__}: {exc}"
    (OUT / "rank0.json").write_text(json.dumps({"shutdown": result}))


def main() -> None:
    scenario, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    options = rpc.RpcOptions(init_method=f"tcp://127.0.0.1:{port}", init_timeout=60)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, options=options)
    {"graceful": graceful, "owner_dies": owner_dies, "peer_dies": peer_dies}[scenario](rank)


if __name__ == "__main__":
    main()
