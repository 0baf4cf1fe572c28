"""torch.distributed.rpc's names over the real grpc transport: init_rpc's shape, async_execution."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc.api import use_agent

from . import rpc_group as g


@rpc.expose
class Gather:
    """Each caller's reply waits until ``size`` callers have arrived (torch's batch-processing pattern)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.values: list[int] = []
        self.future: torch.futures.Future[list[int]] = torch.futures.Future()

    @staticmethod
    @rpc.functions.async_execution
    def arrive(rref: rpc.RRef[Gather], value: int) -> torch.futures.Future[list[int]]:
        self = rref.local_value()
        with self.lock:
            self.values.append(value)
            fut = self.future
            if len(self.values) == self.size:
                fut.set_result(sorted(self.values))
        return fut


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_init_rpc_in_torchs_shape_with_tensorpipe_options() -> None:
    opts = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=4, rpc_timeout=7, init_method=f"tcp://127.0.0.1:{_free_port()}"
    )
    rpc.init_rpc("solo", rpc.BackendType.TENSORPIPE, 0, 1, opts)  # torch's positional order
    try:
        assert rpc.get_rpc_timeout() == 7
        assert rpc.get_worker_info() == rpc.WorkerInfo("solo", 0)
        assert rpc.rpc_sync("solo", g.add, args=(1, 2), timeout=-1) == 3
    finally:
        rpc.shutdown(graceful=True)


# over gRPC calls (a synchronous server) each waiting caller holds one of the 8 serving threads
@pytest.mark.parametrize(("sockets", "callers"), [(True, 12), (False, 4)], ids=["sockets", "grpc-calls"])
def test_async_execution_replies_when_the_batch_is_full(sockets: bool, callers: int) -> None:
    with g.rpc_group(2, sockets=sockets) as agents, use_agent(agents[0]):
        gather = rpc.remote("w1", Gather, args=(callers,))
        futs: list[Any] = [rpc.rpc_async("w1", Gather.arrive, args=(gather, i)) for i in range(callers)]
        results = rpc.futures.wait_all(futs)
    assert results == [list(range(callers))] * callers
