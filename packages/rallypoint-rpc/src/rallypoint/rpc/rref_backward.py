"""``RRef.backward``: a backward pass whose root is the value an RRef holds, run on its owner."""

from __future__ import annotations

from typing import Any

import torch

from rallypoint.rpc import autograd as dist_autograd
from rallypoint.rpc.calls import call_sync
from rallypoint.rpc.current import current_agent
from rallypoint.rpc.errors import RpcError
from rallypoint.rpc.exposure import expose

__all__ = ["backward", "backward_on_owner"]

#: An :class:`~rallypoint.rpc.rref.RRef` (not imported: that module loads this one when a
#: backward pass is asked for).
RRefLike = Any


def _root(rref: RRefLike) -> torch.Tensor:
    value = rref.local_value()
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
        raise ValueError(f"RRef {rref.rref_id}.backward() needs a scalar tensor that requires grad as its value")
    return value


@expose
def backward_on_owner(rref: RRefLike, context_id: int, retain_graph: bool) -> None:
    """Run on the owner: the distributed backward pass of ``context_id`` from the RRef's value."""
    dist_autograd.backward(context_id, [_root(rref)], retain_graph=retain_graph)


def backward(rref: RRefLike, context_id: int | None, retain_graph: bool) -> None:
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
        call_sync(current_agent(), rref.owner(), backward_on_owner, (rref, context_id, retain_graph), None, None)
