"""torch's compatibility mode (``[rpc] mode = "torch"``) and values nested in any structure (#36).

The program here is this test directory: its modules' functions and classes are callable without
``@rpc.expose`` in torch's mode, and only there. RRefs, tensors and RemoteModules travel nested
in any argument, under either serializer.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc.api import use_agent
from rallypoint.rpc.errors import RpcRefused
from rallypoint.rpc.exposure import Exposure, program_module
from rallypoint.rpc.nn import RemoteModule

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def torch_mode_group(make_group: Any) -> Any:
    """``torch_mode_group(pickle=..., program=...)``: three agents whose program is this test directory."""

    def group(*, pickle: bool = False, program: bool = True) -> Any:
        rules = lambda: Exposure(everything=pickle, program=program, program_root=HERE)  # noqa: E731
        return make_group(3, exposure=rules, allow_pickle=pickle)

    return group


def plain(x: int) -> int:
    """Not exposed: callable only in torch's mode."""
    return x + 1


def _call_method(method: Any, rref: rpc.RRef[Any], *args: Any) -> Any:
    """The helper torch programs define (a single-underscore name)."""
    return method(rref.local_value(), *args)


def __dunder() -> str:
    return "never"


class Accumulator:
    """A class of the program, neither exposed nor in ``allow``."""

    def __init__(self, start: float) -> None:
        self.total = start

    def add(self, x: float) -> float:
        self.total += x
        return self.total


@dataclass
class Bundle:
    """An argument structure holding references (travels by pickle, or by state in torch's mode)."""

    refs: list[Any]
    tensor: torch.Tensor
    extra: dict[str, Any]


def total_of(bundle: Bundle) -> float:
    """Fetch every RRef of the bundle and add them to its tensor's sum."""
    return float(bundle.tensor.sum()) + sum(float(r.to_here().sum()) for r in bundle.refs)


def apply(fn: Any, value: Any) -> Any:
    return fn(value)


def module_output(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x)


def use_remote_module(holder: dict[str, Any], x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run a received RemoteModule and fetch its parameters through ``remote_parameters()``."""
    module = holder["layers"][0]
    assert isinstance(module, RemoteModule)
    return module(x), [p.to_here() for p in module.remote_parameters()]


def test_the_program_s_functions_and_classes_are_callable_without_expose(torch_mode_group: Any) -> None:
    with torch_mode_group() as agents, use_agent(agents[0]):
        assert rpc.rpc_sync("w1", plain, args=(1,)) == 2
        acc = rpc.remote("w1", Accumulator, args=(1.0,))
        assert rpc.rpc_sync("w1", _call_method, args=(Accumulator.add, acc, 2.0)) == 3.0
        assert acc.rpc_sync().add(4.0) == 7.0


def test_torch_mode_refuses_names_outside_the_program_and_dunders(torch_mode_group: Any) -> None:
    with torch_mode_group() as agents, use_agent(agents[0]):
        import json

        with pytest.raises(RpcRefused, match="only the program's modules"):
            rpc.rpc_sync("w1", json.dumps, args=([1],))
        with pytest.raises(RpcRefused, match="'__'"):
            rpc.rpc_sync("w1", __dunder)
    exposure = Exposure(program=True, program_root=HERE)
    with pytest.raises(RpcRefused, match="'__'"):
        exposure.resolve(f"{__name__}:Accumulator.__init__", worker="w1")
    assert exposure.resolve("torch:add", worker="w1") is torch.add  # an operator
    with pytest.raises(RpcRefused, match="not exposed"):
        exposure.resolve("torch:load", worker="w1")  # Python code that reads files (and unpickles)
    assert program_module(__name__, root=HERE)
    assert not program_module("json", root=HERE)
    assert not program_module("pytest", root=HERE, find=True)
    # looking for a submodule outside the program imports nothing of it (not even its parent)
    before = set(sys.modules)
    assert not program_module("xml.dom.minidom", root=HERE, find=True)
    assert set(sys.modules) == before


def test_without_torch_mode_the_same_calls_are_refused(torch_mode_group: Any) -> None:
    with torch_mode_group(program=False) as agents, use_agent(agents[0]):
        with pytest.raises(RpcRefused, match="not exposed"):
            rpc.rpc_sync("w1", plain, args=(1,))
        with pytest.raises(RpcRefused, match="'_'"):
            rpc.rpc_sync("w1", _call_method, args=(None, None))


@pytest.mark.parametrize("pickle", [False, True], ids=["safe", "pickle"])
def test_rrefs_and_tensors_travel_nested_in_any_argument(torch_mode_group: Any, pickle: bool) -> None:
    with torch_mode_group(pickle=pickle) as agents, use_agent(agents[0]):
        refs = [rpc.remote("w2", torch.ones, args=(3,)), rpc.RRef(torch.full((2,), 5.0))]
        bundle = Bundle(refs=refs, tensor=torch.arange(4.0), extra={"nested": (refs[0],)})
        assert rpc.rpc_sync("w1", total_of, args=(bundle,)) == 6.0 + 3.0 + 10.0
        # the RRefs stayed counted: the values are still there after the callee dropped its copies
        assert float(refs[0].to_here().sum()) == 3.0


@pytest.mark.parametrize("pickle", [False, True], ids=["safe", "pickle"])
def test_a_remote_module_passed_to_another_worker_runs_and_gives_its_parameters(
    torch_mode_group: Any, pickle: bool
) -> None:
    with torch_mode_group(pickle=pickle) as agents, use_agent(agents[0]):
        torch.manual_seed(0)
        layer = RemoteModule("w2", torch.nn.Linear, args=(4, 2))
        x = torch.randn(3, 4)
        out, params = rpc.rpc_sync("w1", use_remote_module, args=({"layers": [layer]}, x))
        assert torch.allclose(out, layer(x))
        local = [p.to_here() for p in layer.remote_parameters()]
        assert all(torch.equal(a, b) for a, b in zip(params, local, strict=True))
        assert len(params) == 2
        back = rpc.rpc_sync("w1", apply, args=(_identity, layer))
        assert isinstance(back, RemoteModule)
        assert back.module_rref.owner_name() == "w2"


def _identity(value: Any) -> Any:
    return value


def test_functions_modules_and_private_names_travel_as_values_under_pickle(torch_mode_group: Any) -> None:
    with torch_mode_group(pickle=True) as agents, use_agent(agents[0]):
        assert rpc.rpc_sync("w1", apply, args=(_identity, 4)) == 4
        assert rpc.rpc_sync("w1", apply, args=(plain, 4)) == 5
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
        x = torch.randn(2, 3)
        assert torch.allclose(rpc.rpc_sync("w1", module_output, args=(net, x)), net(x))
