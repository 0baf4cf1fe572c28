"""A worker resumed by a gradient message answers before its parameters' gradients; reads wait for them.

The callee's parameter carries a hook that holds its gradient at a gate: the caller's
``backward`` must come back while the gate is shut (it waited for the hook before the
parameter pass ran after the reply), and the callee's ``get_gradients`` must wait until it opens.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc import autograd as dist_autograd
from rallypoint.rpc.agent import RpcAgent
from rallypoint.rpc.api import use_agent
from rallypoint.rpc.contexts import RECV_ANCHOR
from rallypoint.rpc.errors import RpcError
from rallypoint.rpc.param_pass import plan_pass

#: gates by name, shut until a test opens them (the hooks run on the callee, in this process)
_GATES: dict[str, threading.Event] = {}


@rpc.expose
def gated_weight(shape: list[int], seed: int, gate: str) -> torch.Tensor:
    """A parameter whose gradient, once computed, waits for gate ``gate`` (or fails, for ``"fail"``)."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(*shape, generator=gen).requires_grad_()

    def hold(grad: torch.Tensor) -> torch.Tensor:
        if gate == "fail":
            raise RuntimeError("the parameter's hook failed on purpose")
        if not _GATES[gate].wait(30):
            raise AssertionError(f"gate {gate} never opened")
        return grad

    weight.register_hook(hold)
    return weight


@rpc.expose
def times_owned(w_ref: rpc.RRef[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return x @ w_ref.local_value()


@rpc.expose
def gradient_of(ctx_id: int, w_ref: rpc.RRef[torch.Tensor]) -> Any:
    return dist_autograd.get_gradients(ctx_id).get(w_ref.local_value())


def _reference(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ref_x, ref_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ((ref_x @ ref_w) ** 2).sum().backward()
    assert ref_x.grad is not None
    assert ref_w.grad is not None
    return ref_x.grad, ref_w.grad


def test_backward_returns_before_the_callee_parameter_gradient_and_reads_wait_for_it(group: list[RpcAgent]) -> None:
    gate = _GATES["held"] = threading.Event()
    try:
        with use_agent(group[0]):
            w_ref = rpc.remote("w1", gated_weight, args=([4, 2], 3, "held"))
            w_value = w_ref.to_here().detach()
            x = torch.randn(3, 4, requires_grad=True)
            with dist_autograd.context() as ctx_id:
                loss = (rpc.rpc_sync("w1", times_owned, args=(w_ref, x)) ** 2).sum()
                returned = threading.Event()

                def run_backward() -> None:
                    with use_agent(group[0]):
                        dist_autograd.backward(ctx_id, [loss])
                    returned.set()

                threading.Thread(target=run_backward, daemon=True).start()
                assert returned.wait(10), "backward waited for w1's parameter gradient (held at the gate)"
                want_x, want_w = _reference(x, w_value)
                torch.testing.assert_close(dist_autograd.get_gradients(ctx_id)[x], want_x)

                read = rpc.rpc_async("w1", gradient_of, args=(ctx_id, w_ref))
                time.sleep(0.3)
                assert not read.done(), "w1 answered get_gradients before its parameter gradient was computed"
                gate.set()
                torch.testing.assert_close(read.wait(), want_w)
    finally:
        gate.set()


def test_a_failed_parameter_pass_is_raised_where_its_gradients_are_read(group: list[RpcAgent]) -> None:
    with use_agent(group[0]):
        w_ref = rpc.remote("w1", gated_weight, args=([4, 2], 5, "fail"))
        x = torch.randn(3, 4, requires_grad=True)
        with dist_autograd.context() as ctx_id:
            loss = (rpc.rpc_sync("w1", times_owned, args=(w_ref, x)) ** 2).sum()
            dist_autograd.backward(ctx_id, [loss])
            assert x in dist_autograd.get_gradients(ctx_id)  # this worker's share is complete
            with pytest.raises(RpcError, match=r"parameter gradients of context .* on w1 failed: RuntimeError"):
                rpc.rpc_sync("w1", gradient_of, args=(ctx_id, w_ref))


def test_the_next_step_sees_the_previous_parameter_gradient_applied(group: list[RpcAgent]) -> None:
    """Steps back to back with the distributed optimizer: each step reads a complete gradient."""
    with use_agent(group[0]):
        _GATES["open"] = threading.Event()
        _GATES["open"].set()
        w_ref = rpc.remote("w1", gated_weight, args=([4, 2], 9, "open"))
        w_local = w_ref.to_here().detach().clone().requires_grad_()
        opt = rpc.DistributedOptimizer(torch.optim.SGD, [w_ref], lr=0.05)
        local_opt = torch.optim.SGD([w_local], lr=0.05)
        x = torch.randn(64, 4, requires_grad=True)  # sent with its graph: w1's pass is split
        for _ in range(5):
            with dist_autograd.context() as ctx_id:
                dist_autograd.backward(ctx_id, [(rpc.rpc_sync("w1", times_owned, args=(w_ref, x)) ** 2).sum()])
                opt.step(ctx_id)
            local_opt.zero_grad()
            ((x @ w_local) ** 2).sum().backward()
            local_opt.step()
        torch.testing.assert_close(w_ref.to_here(), w_local.detach())


# ------------------------------------------------------------------------ where a pass is split
class _Recv(torch.autograd.Function):
    """Stands in for a recv node: identity whose input is a marked anchor."""

    @staticmethod
    def forward(fctx: Any, anchor: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return value.view_as(value)

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        return None, None


def _received(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    anchor = torch.empty(0, requires_grad=True)
    setattr(anchor, RECV_ANCHOR, True)
    return anchor, _Recv.apply(anchor, torch.randn(*shape))  # type: ignore[no-untyped-call]


def test_one_layer_splits_where_its_weights_branch_off() -> None:
    anchor, x = _received((3, 4))
    layer = torch.nn.Linear(4, 2)
    out = torch.relu(layer(x))
    plan = plan_pass([out], RECV_ANCHOR, split=True)
    assert plan.anchors == [anchor]
    assert {id(t) for t in plan.own} == {id(layer.weight), id(layer.bias)}
    assert [type(e.node).__name__ for e in plan.branch] == ["AddmmBackward0"]  # not the relu before it


def test_no_split_without_received_tensors_with_several_branch_points_or_when_not_asked() -> None:
    layer = torch.nn.Linear(4, 2)
    assert plan_pass([layer(torch.randn(3, 4))], RECV_ANCHOR, split=True).branch == []  # nothing received
    _, x = _received((3, 4))
    stack = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    deep = plan_pass([stack(x)], RECV_ANCHOR, split=True)
    assert deep.branch == []  # the weights branch off at both layers
    assert len(deep.own) == 4
    assert plan_pass([layer(x)], RECV_ANCHOR, split=False).branch == []


class _Count(torch.autograd.Function):
    """Identity that counts its backward calls (on the callee, between the layer and the reply)."""

    calls = 0

    @staticmethod
    def forward(fctx: Any, value: torch.Tensor) -> torch.Tensor:
        return value.view_as(value)

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> torch.Tensor:
        _Count.calls += 1
        return grad


@rpc.expose
def counted_layer(w_ref: rpc.RRef[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return _Count.apply(torch.tanh(x) @ w_ref.local_value())  # type: ignore[no-untyped-call]


def test_a_split_pass_computes_each_gradient_once_and_gets_the_same_gradients(group: list[RpcAgent]) -> None:
    _GATES["counted"] = threading.Event()
    _GATES["counted"].set()
    with use_agent(group[0]):
        w_ref = rpc.remote("w1", gated_weight, args=([4, 2], 11, "counted"))
        w_value = w_ref.to_here().detach()
        x = torch.randn(3, 4, requires_grad=True)
        _Count.calls = 0
        with dist_autograd.context() as ctx_id:
            loss = (rpc.rpc_sync("w1", counted_layer, args=(w_ref, x)) ** 2).sum()
            dist_autograd.backward(ctx_id, [loss])
            got_x = dist_autograd.get_gradients(ctx_id)[x]
            got_w = rpc.rpc_sync("w1", gradient_of, args=(ctx_id, w_ref))
        assert _Count.calls == 1  # the node above the branch point ran in part 1 only
        ref_x, ref_w = x.detach().clone().requires_grad_(), w_value.clone().requires_grad_()
        ((torch.tanh(ref_x) @ ref_w) ** 2).sum().backward()
        torch.testing.assert_close(got_x, ref_x.grad)
        torch.testing.assert_close(got_w, ref_w.grad)
