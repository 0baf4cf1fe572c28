"""torch.distributed.rpc's names and signatures, as a program written for torch uses them."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc.agent import RpcAgent
from rallypoint.rpc.api import use_agent
from rallypoint.rpc.backend_options import merge_backend_options

RELEASE = threading.Event()


@rpc.expose
def wait_release(seconds: float) -> str:
    return "released" if RELEASE.wait(seconds) else "not released"


@rpc.expose
def plus(a: Any, b: Any) -> Any:
    return a + b


@rpc.expose
class Box:
    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


def test_init_rpc_takes_torch_backend_options_and_refuses_what_it_cannot_honour() -> None:
    cases = [
        (rpc.TensorPipeRpcBackendOptions(device_maps={"w1": {0: 1}}), "device_maps and devices"),
        (rpc.TensorPipeRpcBackendOptions(devices=["cuda:0"]), "arrives on the CPU"),
        (rpc.TensorPipeRpcBackendOptions(_transports=["shm"]), r"_transports=\['shm'\] cannot be mapped"),
        (rpc.TensorPipeRpcBackendOptions(_channels=["basic"]), "TensorPipe's internal channels"),
    ]
    mapped = rpc.TensorPipeRpcBackendOptions()
    mapped.set_device_map("w1", {"cuda:0": "cuda:1"})
    cases.append((mapped, "RemoteModule"))
    for opts, message in cases:
        with pytest.raises(rpc.RpcError, match=message):  # refused before anything starts
            rpc.init_rpc("w0", rpc.BackendType.TENSORPIPE, 0, 2, opts, environ={})
    with pytest.raises(rpc.RpcError, match="backend='GLOO' is not supported"):
        rpc.init_rpc("w0", backend="GLOO", rank=0, world_size=2, environ={})


def test_only_the_backend_options_a_program_gives_override_the_jobs_rpc_section() -> None:
    job = rpc.RpcOptions(rpc_timeout=5, num_worker_threads=4, init_method="tcp://store:1", source="[rpc] of job.toml")
    untouched = merge_backend_options(job, rpc.BackendType.TENSORPIPE, rpc.TensorPipeRpcBackendOptions())
    assert (untouched.rpc_timeout, untouched.num_worker_threads, untouched.init_method) == (5, 4, "tcp://store:1")
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, init_method="env://")
    opts.rpc_timeout = 20  # torch lets a program set them afterwards too
    merged = merge_backend_options(job, None, opts)
    assert (merged.rpc_timeout, merged.num_worker_threads, merged.init_method) == (20, 8, None)
    assert merged.source == "[rpc] of job.toml and rpc_backend_options"
    assert (opts.rpc_timeout, opts.num_worker_threads, opts.init_method) == (20.0, 8, "env://")
    assert rpc.TensorPipeRpcBackendOptions().rpc_timeout == 60.0  # torch's defaults, when not given
    tcp_only = merge_backend_options(job, None, rpc.TensorPipeRpcBackendOptions(_transports=["uv"]))
    assert tcp_only.transport_options == {"same_host_shm": False}
    with pytest.raises(ValueError, match="num_worker_threads"):
        rpc.TensorPipeRpcBackendOptions(num_worker_threads=0)


def test_a_negative_timeout_means_the_default_as_in_torch(group: list[RpcAgent]) -> None:
    agent = group[0]
    assert agent.effective_timeout(-1.0) == agent.timeout  # torch's UNSET_RPC_TIMEOUT
    assert agent.effective_timeout(None) == agent.timeout
    assert agent.effective_timeout(0) is None  # 0: no timeout, as in torch
    assert agent.effective_timeout(2.5) == 2.5


def test_worker_info_rref_methods_and_proxies_have_torch_names(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        me = rpc.get_worker_info()
        assert (me.name, me.id) == ("w0", 0)
        assert rpc.get_worker_info("w2").id == 2
        rref = rpc.remote("w1", Box, args=(torch.ones(2),), timeout=-1)
        assert rref.owner() == rpc.get_worker_info("w1")
        assert rref.owner_name() == "w1"
        assert not rref.is_owner()
        assert torch.equal(rref.to_here(timeout=-1).value, torch.ones(2))
        assert rref.confirmed_by_owner()  # the owner answered to_here: it has the value
        assert torch.equal(rref.rpc_sync(timeout=-1).get(), torch.ones(2))
        assert torch.equal(rref.rpc_async().get().wait(), torch.ones(2))
        assert torch.equal(rref.remote().get().to_here(), torch.ones(2))
        with pytest.raises(rpc.RpcError, match="use to_here"):
            rref.local_value()
        local = rpc.RRef(torch.zeros(1), type_hint=torch.Tensor)
        assert local.is_owner()
        assert local.confirmed_by_owner()
        assert torch.equal(local.local_value(), torch.zeros(1))
        assert rpc.rpc_sync("w1", wait_release, args=(0,), timeout=-1) == "not released"


def test_futures_wait_all_takes_rallypoint_and_torch_futures(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        futs: list[Any] = [rpc.rpc_async(f"w{i}", plus, args=(torch.ones(1), i)) for i in (1, 2)]
    done: torch.futures.Future[int] = torch.futures.Future()
    done.set_result(7)
    results = rpc.futures.wait_all([*futs, done])
    assert [r.item() for r in results[:2]] == [2.0, 3.0]
    assert results[2] == 7
    failed: rpc.Future[int] = rpc.Future()
    failed.set_exception(KeyError("lost"))
    with pytest.raises(KeyError, match="lost"):
        rpc.futures.wait_all([done, failed])
    assert rpc.futures.wait_all([]) == []
    together = rpc.futures.collect_all([done, failed]).wait()
    assert together[0].wait() == 7
    assert together[1].exception() is not None


@rpc.expose
def weighted_loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sum()


def test_rref_backward_distributed_from_the_owner_and_local_on_it(group: list[RpcAgent]) -> None:
    from rallypoint.rpc import autograd as dist_autograd

    with use_agent(group[0]):
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        w = torch.tensor([3.0, 4.0], requires_grad=True)
        with dist_autograd.context() as ctx_id:
            loss_rref = rpc.remote("w1", weighted_loss, args=(x, w))
            loss_rref.backward(ctx_id)  # the pass starts on w1 and reaches x and w here
            grads = dist_autograd.get_gradients(ctx_id)
        torch.testing.assert_close(grads[x], w.detach())
        torch.testing.assert_close(grads[w], x.detach())
        with pytest.raises(rpc.RpcError, match="only on the owner w1"):
            loss_rref.backward()
        local = rpc.RRef(weighted_loss(x, w))
        local.backward(retain_graph=True)  # -1: a local pass, gradients in .grad
        torch.testing.assert_close(x.grad, w.detach())
