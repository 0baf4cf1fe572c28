"""``RRef.backward``: a backward pass whose root is the value an RRef holds, run on its owner."""

from __future__ import annotations

from typing import Any

import torch

from rallypoint.rpc import autograd as dist_autograd
from rallypoint.rpc.api import rpc_sync
from rallypoint.rpc.errors import RpcError
from rallypoint.rpc.exposure import expose
from rallypoint.rpc.rref import RRef

__all__ = ["backward", "backward_on_owner"]


def _root(rref: RRef[Any]) -> torch.Tensor:
    value = rref.local_value()
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
        raise ValueError(f"RRef {rref.rref_id}.backward() needs a scalar tensor that requires grad as its value")
    return value


@expose
def backward_on_owner(rref: RRef[Any], context_id: int, retain_graph: bool) -> None:
    """Run on the owner: the distributed backward pass of ``context_id`` from the RRef's value."""
    dist_autograd.backward(context_id, [_root(rref)], retain_graph=retain_graph)


def backward(rref: RRef[Any], context_id: int | None, retain_graph: bool) -> None:
    """See :meth:`RRef.backward`."""
    if context_id is None or context_id == -1:
        if not rref.is_owner():
            raise RpcError(
                f"RRef {rref.rref_id}.backward() without a distributed autograd context runs a local backward "
                f"pass, only on the owner {rref.owner_name()}; pass dist_autograd_ctx_id= from "
                "dist_autograd.context()"
            )
        torch.autograd.backward(_root(rref), retain_graph=retain_graph)
    elif rref.is_owner():
        backward_on_owner(rref, context_id, retain_graph)
    else:
        rpc_sync(rref.owner(), backward_on_owner, args=(rref, context_id, retain_graph))
