"""``rpc.functions.async_execution``, written against torch's names, over the in-memory transport."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc.agent import RpcAgent
from rallypoint.rpc.api import use_agent


@rpc.expose
class BatchServer:
    """torch's batch-processing server pattern: each caller's reply waits until the batch is full."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.lock = threading.Lock()
        self.total = torch.zeros(2)
        self.arrived = 0
        self.future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    @staticmethod
    @rpc.functions.async_execution
    def add_and_wait(server_rref: rpc.RRef[BatchServer], x: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        self = server_rref.local_value()
        with self.lock:
            self.total = self.total + x
            self.arrived += 1
            fut = self.future
            if self.arrived == self.batch_size:  # the last call of the batch answers every one of them
                fut.set_result(self.total)
                self.future, self.arrived = torch.futures.Future(), 0
        return fut

    @rpc.functions.async_execution
    def doubled_later(self, x: torch.Tensor) -> rpc.Future[torch.Tensor]:
        fut: rpc.Future[torch.Tensor] = rpc.Future()
        threading.Timer(0.01, fut.set_result, (x * 2,)).start()
        return fut


@rpc.expose
@rpc.functions.async_execution
def double_async(x: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(x * 2)
    return fut


@rpc.expose
@rpc.functions.async_execution
def relay_async(to: str, x: torch.Tensor) -> rpc.Future[torch.Tensor]:
    """Nested: answers with the future of an async_execution call it makes in turn, plus one."""
    return rpc.rpc_async(to, double_async, args=(x,)).then(lambda fut: fut.wait() + 1)


@rpc.expose
@rpc.functions.async_execution
def fail_async(message: str) -> torch.futures.Future[None]:
    fut: torch.futures.Future[None] = torch.futures.Future()
    threading.Timer(0.01, fut.set_exception, (ValueError(message),)).start()
    return fut


@rpc.expose
@rpc.functions.async_execution
def not_a_future() -> int:
    return 3


def _batch(agents: list[RpcAgent], callers: int) -> list[Any]:
    with use_agent(agents[0]):
        server = rpc.remote("w1", BatchServer, args=(callers,))
        futs = [
            rpc.rpc_async(server.owner(), BatchServer.add_and_wait, args=(server, torch.ones(2) * i))
            for i in range(callers)
        ]
        return rpc.futures.wait_all(futs)


def test_a_batch_server_answers_every_caller_when_the_batch_is_full_without_holding_threads(make_group: Any) -> None:
    # 6 callers, 2 serving threads on the server: each call returns its thread at once, so the
    # sixth call can run and complete the batch; holding a thread per waiting caller would hang
    with make_group(2, threads=2) as agents:
        results = _batch(agents, 6)
    assert all(torch.equal(r, torch.full((2,), 15.0)) for r in results)


def test_without_deferred_replies_a_transport_thread_waits_for_the_future(make_group: Any) -> None:
    with make_group(2, threads=8, deferred=False) as agents:
        results = _batch(agents, 4)
    assert all(torch.equal(r, torch.full((2,), 6.0)) for r in results)


def test_nested_async_execution_rpc_sync_rpc_async_and_remote(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        x = torch.arange(3.0)
        assert torch.equal(rpc.rpc_sync("w1", relay_async, args=("w2", x)), x * 2 + 1)
        assert torch.equal(rpc.rpc_async("w1", relay_async, args=("w2", x)).wait(), x * 2 + 1)
        rref = rpc.remote("w1", relay_async, args=("w2", x))
        assert torch.equal(rref.to_here(), x * 2 + 1)  # the RRef holds the future's value, not the future


def test_async_methods_through_rref_proxies(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        server = rpc.remote("w1", BatchServer, args=(1,))
        x = torch.ones(2)
        assert torch.equal(server.rpc_sync().doubled_later(x), x * 2)
        assert torch.equal(server.rpc_async().doubled_later(x).wait(), x * 2)
        assert torch.equal(server.remote().doubled_later(x).to_here(), x * 2)


def test_an_error_set_on_the_future_reaches_the_caller(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        with pytest.raises(ValueError, match="bad batch") as info:
            rpc.rpc_sync("w1", fail_async, args=("bad batch",))
        assert info.value.remote_worker == "w1"  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="late failure"):
            rpc.rpc_async("w1", fail_async, args=("late failure",)).wait()
        rref = rpc.remote("w1", fail_async, args=("no value",))
        with pytest.raises(ValueError, match="no value"):
            rref.to_here()
        with pytest.raises(TypeError, match="marked async_execution but returned int"):
            rpc.rpc_sync("w1", not_a_future)


def test_calling_an_async_execution_function_locally_returns_its_future() -> None:
    fut = double_async(torch.ones(1))
    assert isinstance(fut, torch.futures.Future)
    assert torch.equal(fut.wait(), torch.full((1,), 2.0))
    assert rpc.functions.is_async_execution(double_async)
    assert not rpc.functions.is_async_execution(_batch)
