"""``RemoteModule``: a ``torch.nn.Module`` that lives on another worker, used like a local one."""

from __future__ import annotations

from typing import Any

import torch

from rallypoint.rpc.api import remote, rpc_async, rpc_sync
from rallypoint.rpc.exposure import expose
from rallypoint.rpc.futures import Future
from rallypoint.rpc.rref import RRef

__all__ = ["RemoteModule", "create_module", "module_forward", "parameter_rrefs"]


def _module(module_rref: RRef[Any]) -> torch.nn.Module:
    module = module_rref.local_value()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"RRef {module_rref.rref_id} holds a {type(module).__qualname__}, not a torch.nn.Module")
    return module


@expose
def create_module(module_cls: Any, args: Any, kwargs: Any, device: str) -> torch.nn.Module:
    """Run on the owner: build ``module_cls(*args, **kwargs)`` on ``device``."""
    if not (isinstance(module_cls, type) and issubclass(module_cls, torch.nn.Module)):
        raise TypeError(f"RemoteModule needs a torch.nn.Module subclass, not {module_cls!r}")
    return module_cls(*args, **kwargs).to(device)


@expose
def module_forward(module_rref: RRef[Any], device: str, args: Any, kwargs: Any) -> Any:
    """Run on the owner: the module's forward, with tensor arguments moved to its device."""

    def move(value: Any) -> Any:
        return value.to(device) if isinstance(value, torch.Tensor) else value

    return _module(module_rref)(*[move(a) for a in args], **{k: move(v) for k, v in kwargs.items()})


@expose
def parameter_rrefs(module_rref: RRef[Any], recurse: bool = True) -> list[RRef[torch.nn.Parameter]]:
    """Run on the owner: RRefs to the module's parameters (for :class:`~rallypoint.rpc.DistributedOptimizer`)."""
    return [RRef(p) for p in _module(module_rref).parameters(recurse)]


@expose
class RemoteModule(torch.nn.Module):
    """A module created on ``remote_device`` whose ``forward`` runs there, shaped like torch's.

    ``RemoteModule("worker1", torch.nn.Linear, args=(4, 2))`` builds the layer on worker1 (or
    ``"worker1/cuda:0"`` for a device there); calling it sends the inputs, runs the layer on
    worker1 and returns the output. Inside a distributed autograd context the backward pass
    reaches the layer's parameters; :meth:`remote_parameters` gives RRefs to them for
    :class:`~rallypoint.rpc.DistributedOptimizer`. ``torch.nn`` classes need no configuration;
    a module class of your own must be exposed (``@rpc.expose``), or be the program's own in
    torch's compatibility mode (``[rpc] mode = "torch"``).

    A RemoteModule travels as an argument or a result of an RPC call (under either serializer,
    nested anywhere): the receiver gets a RemoteModule of the same remote module, whose
    :meth:`forward` and :meth:`remote_parameters` work there too.

    Args:
        remote_device: ``"worker"`` or ``"worker/device"``.
        module_cls: the module class.
        args: positional arguments of ``module_cls``.
        kwargs: keyword arguments of ``module_cls``.
    """

    def __init__(
        self,
        remote_device: str,
        module_cls: type[torch.nn.Module],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        worker, _, device = remote_device.partition("/")
        self.device = device or "cpu"
        self.module_rref: RRef[torch.nn.Module] = remote(
            worker, create_module, args=(module_cls, list(args or ()), dict(kwargs or {}), self.device)
        )

    def __getstate__(self) -> dict[str, Any]:
        """What travels: the RRef to the module and its device (not the local ``nn.Module`` state)."""
        return {"module_rref": self.module_rref, "device": self.device}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild a received RemoteModule around the same remote module."""
        torch.nn.Module.__init__(self)
        rref, device = state.get("module_rref"), state.get("device")
        if not isinstance(rref, RRef) or not isinstance(device, str):
            raise TypeError("a RemoteModule arrived without its module's RRef and device")
        self.module_rref, self.device = rref, device

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module on its owner and return the result."""
        return rpc_sync(self.module_rref.owner(), module_forward, args=(self.module_rref, self.device, args, kwargs))

    def forward_async(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """:meth:`forward` returning a :class:`~rallypoint.rpc.Future`."""
        return rpc_async(self.module_rref.owner(), module_forward, args=(self.module_rref, self.device, args, kwargs))

    def remote_parameters(self, recurse: bool = True) -> list[RRef[torch.nn.Parameter]]:
        """RRefs to the module's parameters (owned by the module's worker)."""
        return rpc_sync(self.module_rref.owner(), parameter_rrefs, args=(self.module_rref, recurse))

    def get_module_rref(self) -> RRef[torch.nn.Module]:
        """The RRef to the module itself."""
        return self.module_rref

    def extra_repr(self) -> str:
        """Shown by ``repr()``: the owner and the device."""
        return f"owner={self.module_rref.owner_name()}, device={self.device}"
