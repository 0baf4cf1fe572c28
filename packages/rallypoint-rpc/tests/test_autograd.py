"""Distributed autograd, the distributed optimizer and remote modules, over an in-memory transport."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc import autograd as dist_autograd
from rallypoint.rpc.agent import RpcAgent
from rallypoint.rpc.api import use_agent


@rpc.expose
def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


@rpc.expose
def relay(to: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Called on one worker, calls ``linear`` on another: the context follows nested calls."""
    return rpc.rpc_sync(to, linear, args=(torch.tanh(x), w)) * 2


@rpc.expose
def owned_weight(shape: list[int], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).requires_grad_()


@rpc.expose
def scale_by_owned(w_ref: rpc.RRef[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return x * w_ref.local_value()


@rpc.expose
def gradients_here(ctx_id: int, w_ref: rpc.RRef[torch.Tensor]) -> Any:
    grads = dist_autograd.get_gradients(ctx_id)
    return grads.get(w_ref.local_value())


def _wait_for(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_backward_reaches_tensors_sent_to_another_worker(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        x = torch.randn(3, 4, requires_grad=True)
        w = torch.randn(4, 2, requires_grad=True)
        with dist_autograd.context() as ctx_id:
            out = rpc.rpc_sync("w1", linear, args=(x, w))
            loss = (out**2).sum()
            dist_autograd.backward(ctx_id, [loss])
            grads = dist_autograd.get_gradients(ctx_id)
        ref_x, ref_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        ((ref_x @ ref_w) ** 2).sum().backward()
        torch.testing.assert_close(grads[x], ref_x.grad)
        torch.testing.assert_close(grads[w], ref_w.grad)
        assert x.grad is None  # never in .grad
        assert w.grad is None


def test_nested_calls_and_remote_leaves(group: list[RpcAgent]) -> None:
    """w0 -> w1 (tanh, then calls w2) -> w2 (matmul with a weight owned by w2); leaves on w0 and w2."""
    with use_agent(group[0]):
        w_ref = rpc.remote("w2", owned_weight, args=([4, 2], 7))
        x = torch.randn(3, 4, requires_grad=True)
        with dist_autograd.context() as ctx_id:
            mid = rpc.rpc_sync("w1", relay, args=("w2", x, torch.ones(4, 2)))
            other = rpc.rpc_sync("w2", scale_by_owned, args=(w_ref, torch.ones(4, 2)))
            loss = mid.sum() + other.pow(2).sum() + x.sum()
            dist_autograd.backward(ctx_id, [loss])
            gx = dist_autograd.get_gradients(ctx_id)[x]
            gw = rpc.rpc_sync("w2", gradients_here, args=(ctx_id, w_ref))
        _wait_for(lambda: all(len(dist_autograd.table(a)) == 0 for a in group), "contexts released everywhere")
        w = w_ref.to_here().detach().requires_grad_()
        rx = x.detach().clone().requires_grad_()
        ((torch.tanh(rx) @ torch.ones(4, 2)) * 2).sum().add((torch.ones(4, 2) * w).pow(2).sum()).add(
            rx.sum()
        ).backward()
        torch.testing.assert_close(gx, rx.grad)
        torch.testing.assert_close(gw, 2 * w.detach())  # d/dw sum((1 * w)^2), on w2


def test_remote_modules_and_the_distributed_optimizer_match_local_training(group: list[RpcAgent]) -> None:
    torch.manual_seed(0)
    data = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(3)]
    with use_agent(group[0]):
        stage1 = rpc.RemoteModule("w1", torch.nn.Linear, args=(4, 3))
        stage2 = rpc.RemoteModule("w2/cpu", torch.nn.Linear, kwargs={"in_features": 3, "out_features": 2})
        params = stage1.remote_parameters() + stage2.remote_parameters()
        assert [p.owner_name() for p in params] == ["w1", "w1", "w2", "w2"]
        local1, local2 = torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)
        with torch.no_grad():
            for mine, theirs in zip([*local1.parameters(), *local2.parameters()], params, strict=True):
                mine.copy_(theirs.to_here())
        opt = rpc.DistributedOptimizer(torch.optim.SGD, params, lr=0.1, momentum=0.5)
        local_opt = torch.optim.SGD([*local1.parameters(), *local2.parameters()], lr=0.1, momentum=0.5)
        for x, y in data:
            with dist_autograd.context() as ctx_id:
                out = stage2(torch.relu(stage1(x)))
                dist_autograd.backward(ctx_id, [torch.nn.functional.mse_loss(out, y)])
                opt.step(ctx_id)
            local_opt.zero_grad()
            torch.nn.functional.mse_loss(local2(torch.relu(local1(x))), y).backward()
            local_opt.step()
        for mine, theirs in zip([*local1.parameters(), *local2.parameters()], params, strict=True):
            torch.testing.assert_close(theirs.to_here(), mine.detach(), atol=1e-6, rtol=0)
            assert theirs.to_here().grad is None  # the owners' .grad was never left set


@rpc.expose
class Accumulator:
    """A shared weight on its owner; trainers' contexts must not mix."""

    def __init__(self) -> None:
        self.w = torch.ones(3, requires_grad=True)
        self.entered = threading.Barrier(2, timeout=10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.wait()  # both trainers are inside their contexts at once
        return self.w * x

    def grad_in(self, ctx_id: int) -> torch.Tensor:
        return dist_autograd.get_gradients(ctx_id)[self.w]


@rpc.expose
def train_once(acc: rpc.RRef[Accumulator], scale: float) -> list[float]:
    with dist_autograd.context() as ctx_id:
        out = acc.rpc_sync().forward(torch.full((3,), scale))
        dist_autograd.backward(ctx_id, [out.sum()])
        grad: torch.Tensor = acc.rpc_sync().grad_in(ctx_id)
        return grad.tolist()


def test_concurrent_contexts_keep_their_own_gradients(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        acc = rpc.remote("w0", Accumulator)
        futs = [rpc.rpc_async("w1", train_once, args=(acc, 2.0)), rpc.rpc_async("w2", train_once, args=(acc, 5.0))]
        assert [f.wait() for f in futs] == [[2.0] * 3, [5.0] * 3]
        assert acc.to_here().w.grad is None


@rpc.expose
def exit_worker(x: torch.Tensor) -> torch.Tensor:
    return x * 3


def test_a_worker_dying_mid_backward_fails_the_pass_naming_it_and_releases_the_context(
    group: list[RpcAgent],
) -> None:
    with use_agent(group[0]):
        x = torch.randn(2, requires_grad=True)
        with dist_autograd.context() as ctx_id:
            mid = rpc.rpc_sync("w1", exit_worker, args=(x,))
            out = rpc.rpc_sync("w2", exit_worker, args=(mid,))
            assert {len(dist_autograd.table(a)) for a in group} == {1}
            group[2].transport.kill()  # type: ignore[attr-defined]
            with pytest.raises(rpc.WorkerUnavailable, match="w2"):
                dist_autograd.backward(ctx_id, [out.sum()])
        _wait_for(lambda: len(dist_autograd.table(group[0])) + len(dist_autograd.table(group[1])) == 0, "release")
        with pytest.raises(rpc.RpcError, match="was released on w0"):
            dist_autograd.get_gradients(ctx_id)


def test_contexts_are_released_on_every_worker_and_late_calls_are_refused(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        with dist_autograd.context() as ctx_id:
            rpc.rpc_sync("w1", relay, args=("w2", torch.ones(2, 2, requires_grad=True), torch.ones(2, 2)))
            assert [dist_autograd.table(a).ids() for a in group] == [[ctx_id]] * 3
        _wait_for(lambda: all(len(dist_autograd.table(a)) == 0 for a in group), "contexts released everywhere")
        with pytest.raises(rpc.RpcError, match="unknown on w0"):
            dist_autograd.get_gradients(ctx_id + 1)
        header = {"op": "call", "fn": "no.such:function", "ad": ctx_id}
        with pytest.raises(rpc.RpcError, match=f"context {ctx_id} was already released on w1"):
            group[0].call(group[1].info, header, {"args": [], "kwargs": {}}, 5, "late call")
        with pytest.raises(ValueError, match="scalar"), dist_autograd.context() as ctx_id:
            dist_autograd.backward(ctx_id, [torch.ones(2, requires_grad=True)])


def test_torch_nn_and_optim_are_allowed_by_default_but_not_names_they_import(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        layer = rpc.remote("w1", torch.nn.Linear, args=(2, 1))
        assert layer.rpc_sync().forward(torch.ones(1, 2)).shape == (1, 1)
        assert rpc.rpc_sync("w1", torch.nn.functional.softmax, args=(torch.zeros(2), 0)).tolist() == [0.5, 0.5]
        with pytest.raises(rpc.RpcRefused, match="outside the modules allowed by default"):
            group[0].call(group[1].info, {"op": "call", "fn": "torch.nn.functional:has_torch_function"}, {}, 5, "x")
        with pytest.raises(rpc.RpcRefused, match="not exposed"):
            group[0].call(group[1].info, {"op": "call", "fn": "torch.serialization:load"}, {}, 5, "x")


def test_a_worker_dying_further_down_the_chain_is_named_at_the_origin(group: list[RpcAgent]) -> None:
    with use_agent(group[0]), dist_autograd.context() as ctx_id:
        x = torch.randn(2, 2, requires_grad=True)
        out = rpc.rpc_sync("w1", relay, args=("w2", x, torch.ones(2, 2, requires_grad=True)))
        group[2].transport.kill()  # type: ignore[attr-defined]
        with pytest.raises(rpc.WorkerUnavailable, match=r"worker w2 \(rank 2, local:\d+\) is unavailable") as lost:
            dist_autograd.backward(ctx_id, [out.sum()])
        assert isinstance(lost.value, dist_autograd.UnavailableInBackward)
        assert lost.value.worker.startswith("w2 ")
        assert "found by w1 in the backward pass" in str(lost.value)
        _wait_for(lambda: len(dist_autograd.table(group[1])) == 0, "w1 released the context")


@rpc.expose
def echo(value: Any) -> Any:
    return value


def test_async_calls_and_rref_proxies_record_in_the_context(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        x = torch.randn(3, requires_grad=True)
        counter = rpc.remote("w2", echo, args=(torch.ones(3),))
        with dist_autograd.context() as ctx_id:
            fut = rpc.rpc_async("w1", echo, args=(x,))  # the reply is decoded in a transport thread
            doubled = fut.wait() * 2
            fetched = rpc.remote("w1", echo, args=(x,)).to_here()
            dist_autograd.backward(ctx_id, [(doubled + fetched * counter.to_here()).sum()])
            torch.testing.assert_close(dist_autograd.get_gradients(ctx_id)[x], torch.full((3,), 3.0))


@pytest.mark.parametrize(
    "header",
    [
        {"op": "ad_grad", "ctx": "nope", "send": 0},
        {"op": "ad_grad", "ctx": True, "send": 0},
        {"op": "ad_grad", "ctx": 12345, "send": 0},  # unknown context
        {"op": "ad_release", "ctx": [1]},
        {"op": "call", "fn": "no.such:function", "ad": -1},
        {"op": "call", "fn": "no.such:function", "ad": "x"},
    ],
)
def test_malformed_autograd_messages_are_errors_not_crashes(group: list[RpcAgent], header: dict[str, Any]) -> None:
    with pytest.raises(rpc.RpcError):
        group[0].call(group[1].info, dict(header), {"grad": torch.ones(2)}, 5, "forged")
    with use_agent(group[0]):  # the worker still answers
        assert rpc.rpc_sync("w1", echo, args=(1,)) == 1


def test_gradients_for_unknown_sends_wrong_shapes_and_forged_tags_are_refused(group: list[RpcAgent]) -> None:
    with use_agent(group[0]), dist_autograd.context() as ctx_id:
        out = rpc.rpc_sync("w1", echo, args=(torch.ones(2, requires_grad=True),))  # w0 kept send 0
        assert out.requires_grad
        for send, grad in [(7, torch.ones(2)), (0, torch.ones(3)), (0, "not a tensor")]:
            header = {"op": "ad_grad", "ctx": ctx_id, "send": send}
            with pytest.raises(rpc.SerializationError, match="gradient for unknown tensor"):
                group[1].call(group[0].info, header, {"grad": grad}, 5, "forged gradient")
        for tag in [[ctx_id, "w9", 0], [ctx_id, "w0"], "tag"]:
            tree = {"$": "tensor", "dtype": "float32", "shape": [1], "strides": [1], "b": 0, "ad": tag}
            with pytest.raises(rpc.SerializationError, match=r"autograd tag|unknown worker"):
                group[1].decoder.decode(tree, [bytearray(4)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")
def test_a_remote_module_on_a_gpu(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        layer = rpc.RemoteModule("w1/cuda:0", torch.nn.Linear, args=(4, 2))
        params = layer.remote_parameters()
        x = torch.randn(3, 4, requires_grad=True)
        with dist_autograd.context() as ctx_id:
            out = layer(x)
            assert out.device.type == "cpu"  # tensors travel through host memory
            dist_autograd.backward(ctx_id, [out.sum()])
            weight = params[0].to_here()
            torch.testing.assert_close(dist_autograd.get_gradients(ctx_id)[x], weight.sum(0).expand(3, 4).cpu())


def test_backward_twice_in_one_context_accumulates(group: list[RpcAgent]) -> None:
    with use_agent(group[0]), dist_autograd.context() as ctx_id:
        x = torch.randn(3, 4, requires_grad=True)
        w = torch.randn(4, 2, requires_grad=True)
        loss = rpc.rpc_sync("w1", linear, args=(x, w)).sum()
        dist_autograd.backward(ctx_id, [loss])
        once = dist_autograd.get_gradients(ctx_id)
        dist_autograd.backward(ctx_id, [loss])  # the graphs on both workers are still there
        twice = dist_autograd.get_gradients(ctx_id)
        torch.testing.assert_close(twice[x], 2 * once[x])
        torch.testing.assert_close(twice[w], 2 * once[w])


@rpc.expose
class MeetingSGD(torch.optim.SGD):
    """Plain SGD (no momentum) whose step reads ``.grad`` while a second step runs, if one can (2 s at most).

    Unless steps on one worker are serialized, both read ``.grad`` after both have placed their
    context's gradients there: one of them reads the other's.
    """

    trainers_ready = threading.Barrier(2)
    meeting = threading.Barrier(2)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        with contextlib.suppress(threading.BrokenBarrierError):  # broken: steps are serialized
            MeetingSGD.meeting.wait(timeout=2)
        params = [p for group in self.param_groups for p in group["params"]]
        grads = [p.grad.clone() for p in params]
        with contextlib.suppress(threading.BrokenBarrierError):
            MeetingSGD.meeting.wait(timeout=2)
        for p, grad in zip(params, grads, strict=True):
            p.sub_(grad, alpha=self.defaults["lr"])
        return None


@rpc.expose
def train_with_own_optimizer(w_ref: rpc.RRef[torch.Tensor], scale: float) -> None:
    optimizer = rpc.DistributedOptimizer(MeetingSGD, [w_ref], lr=1.0)
    with dist_autograd.context() as ctx_id:
        out = rpc.rpc_sync(w_ref.owner(), scale_by_owned, args=(w_ref, torch.full((2,), scale)))
        dist_autograd.backward(ctx_id, [out.sum()])  # the gradient of w is `scale`
        MeetingSGD.trainers_ready.wait(timeout=10)  # both trainers step at the same time
        optimizer.step(ctx_id)


def test_trainers_with_optimizers_of_their_own_over_shared_parameters_do_not_mix(group: list[RpcAgent]) -> None:
    MeetingSGD.meeting.reset()
    MeetingSGD.trainers_ready.reset()
    with use_agent(group[0]):
        weight = torch.zeros(2, requires_grad=True)
        w_ref = rpc.RRef(weight)
        futs = [rpc.rpc_async(f"w{t}", train_with_own_optimizer, args=(w_ref, float(t))) for t in (1, 2)]
        for fut in futs:
            fut.wait()
        assert weight.detach().tolist() == [-3.0, -3.0]  # each step applied its own gradient once: -1 - 2
        assert weight.grad is None


def test_a_broadcast_gradient_is_kept_as_a_writable_contiguous_copy() -> None:
    """Gradient messages carry broadcast views (the gradient of a sum); the stored gradient is a real tensor."""
    from rallypoint.rpc.autograd import DistContext

    class _Agent:
        pass

    agent = _Agent()
    ctx = DistContext(agent, 1)
    leaf = torch.zeros(3, 4, requires_grad=True)
    ctx.accumulate(leaf, torch.tensor(1.0).expand(3, 4))
    grad = ctx.grads[leaf]
    assert grad.is_contiguous()
    grad.mul_(2)  # an optimizer may write to it; an expanded view refuses in-place writes
    assert torch.equal(grad, torch.full((3, 4), 2.0))
    ctx.accumulate(leaf, torch.tensor(0.5).expand(3, 4))
    assert torch.equal(ctx.grads[leaf], torch.full((3, 4), 2.5))


@contextlib.contextmanager
def _gradient_messages(group: list[RpcAgent]) -> Iterator[dict[str, int]]:
    """Count the gradient messages each worker receives (by worker name)."""
    counts = {agent.info.name: 0 for agent in group}
    originals = {}
    for agent in group:
        originals[agent] = agent._ops["ad_grad"]

        def counted(
            tree: dict[str, Any], bufs: list[Any], _name: str = agent.info.name, _op: Any = originals[agent]
        ) -> Any:
            counts[_name] += 1
            return _op(tree, bufs)

        agent._ops["ad_grad"] = counted
    try:
        yield counts
    finally:
        for agent, op in originals.items():
            agent._ops["ad_grad"] = op


@rpc.expose
def branch(to: str, x: torch.Tensor) -> torch.Tensor:
    """Uses ``x`` itself and the result of another worker: its backward pass sends to both."""
    return rpc.rpc_sync(to, linear, args=(x, torch.ones(2, 2))) + 3 * x


def test_gradients_for_the_sender_travel_in_the_reply(group: list[RpcAgent]) -> None:
    """A pass whose gradients all go back to the worker that sent it answers with them: one message per hop."""
    with use_agent(group[0]):
        x = torch.randn(3, 4, requires_grad=True)
        w = torch.randn(4, 2, requires_grad=True)
        with _gradient_messages(group) as counts, dist_autograd.context() as ctx_id:
            dist_autograd.backward(ctx_id, [rpc.rpc_sync("w1", linear, args=(x, w)).sum()])
            grads = dist_autograd.get_gradients(ctx_id)
        assert counts == {"w0": 0, "w1": 1, "w2": 0}  # w1's gradients of x and w came back in its reply
        torch.testing.assert_close(grads[x], torch.ones(3, 2) @ w.detach().T)
        torch.testing.assert_close(grads[w], x.detach().T @ torch.ones(3, 2))

        with _gradient_messages(group) as counts, dist_autograd.context() as ctx_id:
            out = rpc.rpc_sync("w1", relay, args=("w2", x, torch.ones(4, 2)))  # w0 -> w1 -> w2
            dist_autograd.backward(ctx_id, [out.sum()])
            got = dist_autograd.get_gradients(ctx_id)[x]
        assert counts == {"w0": 0, "w1": 1, "w2": 1}  # w2 answers w1, whose resumed pass answers w0
        ref = x.detach().clone().requires_grad_()
        (2 * (torch.tanh(ref) @ torch.ones(4, 2))).sum().backward()
        torch.testing.assert_close(got, ref.grad)


def test_a_pass_that_branches_out_sends_every_gradient_on_its_own(group: list[RpcAgent]) -> None:
    """w1's pass sends to w0 (its sender) and to w2: the gradient for w0 does not wait for w2's branch."""
    with use_agent(group[0]):
        x = torch.randn(2, 2, requires_grad=True)
        with _gradient_messages(group) as counts, dist_autograd.context() as ctx_id:
            out = rpc.rpc_sync("w1", branch, args=("w2", x))
            dist_autograd.backward(ctx_id, [out.sum()])
            got = dist_autograd.get_gradients(ctx_id)[x]
        # w0 gets 3 * ones in a message of its own; w2's share comes back to w1 in w2's reply and
        # from w1 to w0 in w1's reply
        assert counts == {"w0": 1, "w1": 1, "w2": 1}
        torch.testing.assert_close(got, torch.full((2, 2), 5.0))


class _SeesItsGradient(torch.autograd.Function):
    """Identity whose backward notes the strides of the gradient it is given."""

    strides: ClassVar[list[tuple[int, ...]]] = []

    @staticmethod
    def forward(fctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> torch.Tensor:
        _SeesItsGradient.strides.append(tuple(grad.stride()))
        return grad


@rpc.expose
def sees_its_gradient(x: torch.Tensor) -> torch.Tensor:
    return _SeesItsGradient.apply(x)  # type: ignore[no-untyped-call,no-any-return]


def test_a_gradient_that_travelled_as_a_broadcast_view_is_laid_out_in_full_on_arrival(
    group: list[RpcAgent],
) -> None:
    """The gradient of a sum travels as one element; the receiving pass gets ordinary memory.

    A matrix product cannot read a view whose elements share memory: it would copy it at every
    product of the pass (tools/bench/rpc_autograd.py: one remote nn.Linear).
    """
    _SeesItsGradient.strides.clear()
    with use_agent(group[0]):
        x = torch.randn(4, 8, requires_grad=True)
        with dist_autograd.context() as ctx_id:
            out = rpc.rpc_sync("w1", sees_its_gradient, args=(x,))
            dist_autograd.backward(ctx_id, [out.sum()])
            grad = dist_autograd.get_gradients(ctx_id)[x]
    assert _SeesItsGradient.strides == [(8, 1)]  # not (0, 0)
    assert torch.equal(grad, torch.ones(4, 8))
