"""A worker that dies in the middle of a backward pass (run by test_rpc_autograd.py through ``rallypoint run``).

worker0 sends a tensor through worker1 and worker2 in a distributed autograd context; worker2's
part of the graph ends the process (exit status 0, so that the launcher does not stop the other
workers) when its backward runs. worker0 records the error its ``backward`` raised and whether
worker1 released the context, then tells worker1 to leave.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from rallypoint import rpc
from rallypoint.rpc import autograd as dist_autograd
from rallypoint.rpc.api import current_agent

DONE = threading.Event()


class _DieInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        os._exit(0)


@rpc.expose
def double(x: torch.Tensor) -> torch.Tensor:
    """worker1's part."""
    return x * 2


@rpc.expose
def fragile(x: torch.Tensor) -> torch.Tensor:
    """worker2's part: its backward ends the process."""
    return _DieInBackward.apply(x)


@rpc.expose
def contexts() -> int:
    """How many distributed autograd contexts this worker holds."""
    return len(dist_autograd.table(current_agent()))


@rpc.expose
def finish() -> None:
    """worker0 is done with this worker."""
    DONE.set()


def main() -> None:
    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}")
    if rank == 0:
        x = torch.ones(4, requires_grad=True)
        result: dict[str, Any] = {}
        with dist_autograd.context() as ctx_id:
            mid = rpc.rpc_sync("worker1", double, args=(x,))
            out = rpc.rpc_sync("worker2", fragile, args=(mid,))
            result["worker1_contexts_before"] = rpc.rpc_sync("worker1", contexts)
            try:
                dist_autograd.backward(ctx_id, [out.sum()])
            except rpc.WorkerUnavailable as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
        deadline = time.monotonic() + 30
        while rpc.rpc_sync("worker1", contexts) and time.monotonic() < deadline:
            time.sleep(0.05)
        result["worker1_contexts_after"] = rpc.rpc_sync("worker1", contexts)
        result["worker0_contexts_after"] = len(dist_autograd.table(current_agent()))
        rpc.rpc_sync("worker1", finish)
        Path(sys.argv[1], "dying.json").write_text(json.dumps(result))
    else:
        DONE.wait(120)  # worker2 never gets past this: its backward ends the process
    rpc.shutdown(graceful=False)


if __name__ == "__main__":
    main()
