"""``DistributedOptimizer``: step the owners' parameters with one distributed autograd context's gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rallypoint.rpc.api import remote
from rallypoint.rpc.autograd import get_gradients, lending_grad
from rallypoint.rpc.exposure import expose
from rallypoint.rpc.rref import RRef

__all__ = ["DistributedOptimizer", "OwnerOptimizer"]


@expose
class OwnerOptimizer:
    """The optimizer of one owner's parameters (created there by :class:`DistributedOptimizer`).

    A step takes the gradients of one context (never ``.grad``): they are placed in ``.grad`` for
    the optimizer's ``step()`` only, while no other step or backward pass on this worker uses
    ``.grad`` (:func:`~rallypoint.rpc.autograd.lending_grad`: one step at a time across every
    OwnerOptimizer here, since trainers that each made a DistributedOptimizer over the same
    parameters have one OwnerOptimizer each on the owner), and the previous ``.grad`` is put back,
    so trainers stepping concurrently never see each other's gradients.
    """

    def __init__(
        self, optimizer_class: Any, params: list[RRef[torch.Tensor]], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> None:
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"DistributedOptimizer needs a torch.optim.Optimizer subclass, not {optimizer_class!r}")
        self.params = [rref.local_value() for rref in params]
        self.optimizer = optimizer_class(self.params, *args, **kwargs)

    def step(self, context_id: int) -> None:
        """Step with the gradients that context ``context_id`` left on this worker."""
        grads = get_gradients(context_id)
        with lending_grad():
            saved = [p.grad for p in self.params]
            try:
                for p in self.params:
                    p.grad = grads.get(p)
                self.optimizer.step()
            finally:
                for p, grad in zip(self.params, saved, strict=True):
                    p.grad = grad


class DistributedOptimizer:
    """A torch optimizer over parameters that live on other workers, shaped like torch's.

    One ``optimizer_class`` instance is created on each owner of ``params_rref`` (RRefs to
    parameters, e.g. :meth:`~rallypoint.rpc.RemoteModule.remote_parameters`);
    :meth:`step` steps them all in parallel with the gradients of one distributed autograd
    context. ``torch.optim`` optimizers travel without configuration; another class must be
    exposed (``@rpc.expose``) on the owners.

    Args:
        optimizer_class: the optimizer (``torch.optim.SGD``...).
        params_rref: RRefs to the parameters (owned anywhere, this worker included).
        *args: passed to ``optimizer_class`` after the parameters.
        **kwargs: passed to ``optimizer_class``.
    """

    def __init__(self, optimizer_class: Any, params_rref: Sequence[RRef[Any]], *args: Any, **kwargs: Any) -> None:
        by_owner: dict[str, list[RRef[Any]]] = {}
        for rref in params_rref:
            by_owner.setdefault(rref.owner_name(), []).append(rref)
        self.remote_optimizers: list[RRef[OwnerOptimizer]] = [
            remote(owner, OwnerOptimizer, args=(optimizer_class, rrefs, list(args), kwargs))
            for owner, rrefs in by_owner.items()
        ]

    def step(self, context_id: int) -> None:
        """Step every owner's optimizer with context ``context_id``'s gradients, in parallel.

        Raises:
            RpcError: an owner failed (the error names it); the other owners have stepped.
        """
        futures = [opt.rpc_async().step(context_id) for opt in self.remote_optimizers]
        first: BaseException | None = None
        for fut in futures:
            try:
                fut.wait()
            except BaseException as exc:  # noqa: BLE001 - raised once every owner has answered
                first = first or exc
        if first is not None:
            raise first
