"""DistributedDataParallel inside a distributed autograd context (torch's "DDP + RPC" pattern).

Two trainers (threads with an RPC agent each) wrap the same local layer in DDP over a Gloo group
of their own, feed it the output of a weight held on a third worker, and run ``backward`` in a
context. DDP must average the layer's gradient between them, as it does under torch's distributed
autograd: the gradients in both contexts are the mean of the trainers' own, and replicas trained
with them stay identical.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from rallypoint import rpc
from rallypoint.rpc import autograd as dist_autograd
from rallypoint.rpc.agent import RpcAgent
from rallypoint.rpc.api import use_agent
from rallypoint.rpc.optimizer import OwnerOptimizer


@rpc.expose
def project(x: torch.Tensor, w_ref: rpc.RRef[torch.Tensor]) -> torch.Tensor:
    """The remote half of the model: ``x @ w`` with ``w`` held by its owner."""
    return x @ w_ref.local_value()


def _gloo_group(store: dist.Store, rank: int, size: int) -> dist.ProcessGroup:
    """A Gloo process group of ``size`` threads of this process (DDP's ``process_group``)."""
    backend = dist.ProcessGroupGloo(store, rank, size, timedelta(seconds=30))
    group = dist.ProcessGroup(store, rank, size)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    for device in ("cpu", "cuda"):  # Gloo reduces CUDA tensors too
        group._register_backend(torch.device(device), dist.ProcessGroup.BackendType.GLOO, backend)
    return group


def _in_threads(count: int, body: Callable[[int], Any]) -> list[Any]:
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = body(index)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a trainer hung"
    return results


def _data(trainer: int, step: int) -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(100 * trainer + step))


_CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")],
)


@pytest.mark.parametrize("device", ["cpu", _CUDA])
@pytest.mark.parametrize("bucket_view", [False, True], ids=["copied", "bucket-view"])
def test_ddp_averages_gradients_inside_a_context_and_replicas_stay_identical(
    group: list[RpcAgent], bucket_view: bool, device: str
) -> None:
    store = dist.HashStore()
    with use_agent(group[0]):
        w_ref = rpc.RRef(torch.randn(4, 3, generator=torch.Generator().manual_seed(1)).requires_grad_())
    # Each trainer's DDP (and so its Gloo group) outlives both trainers. Freed in a trainer's thread
    # as it returns, the group joins its worker threads holding the GIL, while a worker thread that
    # is freeing the last all-reduce's work waits for the GIL (torch 2.13): the whole process hung.
    # Freed here, after both trainers have returned, its worker threads are idle.
    keep: list[nn.Module] = []

    def trainer(index: int) -> dict[str, Any]:
        with use_agent(group[index + 1]):
            torch.manual_seed(index)  # different initial weights: DDP broadcasts rank 0's
            ddp = nn.parallel.DistributedDataParallel(
                nn.Linear(3, 2).to(device),
                process_group=_gloo_group(dist.PrefixStore("ddp", store), index, 2),
                gradient_as_bucket_view=bucket_view,
            )
            keep.append(ddp)
            own_grads, context_grads = [], []
            for step in range(3):
                with dist_autograd.context() as ctx_id:
                    hidden = rpc.rpc_sync("w0", project, args=(_data(index, step), w_ref))
                    loss = ddp(hidden.to(device)).pow(2).sum()
                    dist_autograd.backward(ctx_id, [loss])
                    grads = dist_autograd.get_gradients(ctx_id)
                    context_grads.append([grads[p].clone() for p in ddp.parameters()])
                # the trainer's own (not averaged) gradient at the same weights
                copy = nn.Linear(3, 2).to(device)
                copy.load_state_dict(ddp.module.state_dict())
                copy((_data(index, step) @ w_ref.to_here()).to(device)).pow(2).sum().backward()
                own_grads.append([p.grad.clone() for p in copy.parameters()])
                with torch.no_grad():  # an SGD step from the context's gradients
                    for p, g in zip(ddp.parameters(), context_grads[-1], strict=True):
                        p.sub_(0.1 * g)
                assert all(p.grad is None for p in ddp.parameters())  # never left in .grad
            return {"own": own_grads, "context": context_grads, "weights": [p.detach() for p in ddp.parameters()]}

    first, second = _in_threads(2, trainer)
    for step in range(3):
        for a, b, own_a, own_b in zip(
            first["context"][step], second["context"][step], first["own"][step], second["own"][step], strict=True
        ):
            torch.testing.assert_close(a, b)  # both contexts hold the averaged gradient
            torch.testing.assert_close(a, (own_a + own_b) / 2)
    for a, b in zip(first["weights"], second["weights"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the replicas stayed identical


class _Gate(torch.autograd.Function):
    """Identity whose backward lets a step start, then waits (1 s at most) for it to lend ``.grad``."""

    may_step = threading.Event()
    lent = threading.Event()
    accumulated = threading.Event()

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        _Gate.may_step.set()
        _Gate.lent.wait(timeout=1)  # times out where the step waits for this pass to end
        return grad


class _SignallingSGD(torch.optim.SGD):
    """SGD that says when it holds ``.grad`` and gives a pass under way the time to reach the leaf."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        _Gate.lent.set()
        _Gate.accumulated.wait(timeout=1)
        return super().step(closure)


def test_an_optimizer_step_never_lends_grad_in_the_middle_of_a_backward_pass(group: list[RpcAgent]) -> None:
    """A step of one context and a backward pass of another on one worker take turns with ``.grad``.

    The pass is held at a node upstream of the leaf while a step of context A would place A's
    gradient in the leaf's ``.grad``: the leaf's accumulator would then add this pass's gradient
    into A's, in place, and both contexts would hold the sum.
    """
    for event in (_Gate.may_step, _Gate.lent, _Gate.accumulated):
        event.clear()
    with use_agent(group[0]):
        weight = torch.zeros(2, requires_grad=True)
        optimizer = OwnerOptimizer(_SignallingSGD, [rpc.RRef(weight)], [], {"lr": 1.0})
        with dist_autograd.context() as ctx_a, dist_autograd.context() as ctx_b:
            dist_autograd.backward(ctx_a, [(weight * 1.0).sum()])
            grad_a = dist_autograd.get_gradients(ctx_a)[weight]

            def step() -> None:
                with use_agent(group[0]):
                    assert _Gate.may_step.wait(timeout=10)
                    optimizer.step(ctx_a)

            stepper = threading.Thread(target=step)
            stepper.start()
            weight.register_post_accumulate_grad_hook(lambda _: _Gate.accumulated.set())
            dist_autograd.backward(ctx_b, [_Gate.apply(weight * 2.0).sum()])
            stepper.join(timeout=10)
            assert dist_autograd.get_gradients(ctx_b)[weight].tolist() == [2.0, 2.0]
            assert grad_a.tolist() == [1.0, 1.0]  # context A's own gradient, untouched
        assert weight.detach().tolist() == [-1.0, -1.0]  # stepped once, with A's gradient
        assert weight.grad is None
