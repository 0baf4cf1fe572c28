"""The distributed autograd contexts one worker takes part in: their gradients, sent tensors and peers.

A context is created by :func:`rallypoint.rpc.autograd.context` on the worker that starts it and
on every other worker by the first message of the context it receives; it is released on every
worker it reached when the ``with`` block exits or a backward pass fails. The table also holds
what is the worker's alone across contexts: the lock over the ``.grad`` of its tensors, the
gradient messages of the pass that holds it, and its queue of parameter passes
(:mod:`rallypoint.rpc.param_pass`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections import OrderedDict
from typing import Any

import torch

from rallypoint.rpc.errors import RpcError, SerializationError
from rallypoint.rpc.param_pass import ParameterPasses, Pending

__all__ = ["ContextTable", "DistContext", "RECV_ANCHOR", "table"]

_RELEASED_KEPT = 65536  # ids of released contexts remembered per worker (late messages are refused)
#: the attribute that marks a context's anchor (the input of its recv nodes, never a parameter)
RECV_ANCHOR = "_rallypoint_recv_anchor"


class DistContext:
    """One worker's share of a distributed autograd context.

    Attributes:
        id: the context's id (unique in the group: the origin's rank in the high bits).
        grads: gradients of this worker's leaves, keyed by the leaf tensor.
        sends: tensors this worker sent in the context, by send id (their graphs stay alive).
        peers: workers this worker exchanged messages with in the context (released with it).
        pending: parameter passes of the context still queued or running here (see
            :mod:`rallypoint.rpc.param_pass`); its gradients are read once they are done.
    """

    def __init__(self, agent: Any, ctx_id: int) -> None:
        self.id = ctx_id
        self._agent = weakref.ref(agent)  # the agent's table holds its contexts: no cycle through them
        self.lock = threading.Lock()
        self.grads: dict[torch.Tensor, torch.Tensor] = {}
        self.sends: dict[int, torch.Tensor] = {}
        self.peers: set[str] = set()
        self.pending = Pending()
        self._send_ids = itertools.count()
        # the input of every recv node: makes the node part of the graph that reaches the leaves
        self.anchor = torch.empty(0, requires_grad=True)
        setattr(self.anchor, RECV_ANCHOR, True)

    @property
    def agent(self) -> Any:
        """The worker's agent."""
        return _alive(self._agent)

    def add_peer(self, name: str) -> None:
        """Note a worker this context was sent to (or came from)."""
        if name != self.agent.info.name:
            with self.lock:
                self.peers.add(name)

    def record_send(self, tensor: torch.Tensor) -> int:
        """Keep a tensor being sent; returns its send id."""
        send_id = next(self._send_ids)
        with self.lock:
            self.sends[send_id] = tensor
        return send_id

    def accumulate(self, leaf: torch.Tensor, grad: torch.Tensor) -> None:
        """Add ``grad`` to the leaf's gradient in this context.

        A gradient whose elements share memory (a broadcast view, e.g. the gradient of a sum, as
        computed here or received) is kept as a contiguous copy: optimizers may write to it.
        """
        if any(s == 0 and n > 1 for n, s in zip(grad.shape, grad.stride(), strict=True)):
            grad = grad.contiguous()
        with self.lock:
            previous = self.grads.get(leaf)
            self.grads[leaf] = grad if previous is None else previous + grad


class ContextTable:
    """The contexts one worker takes part in."""

    def __init__(self, agent: Any) -> None:
        self._agent = weakref.ref(agent)  # a value of _TABLES, which is keyed by the agent itself
        self._lock = threading.Lock()
        self._contexts: dict[int, DistContext] = {}
        self._released: OrderedDict[int, None] = OrderedDict()
        self._counter = itertools.count()
        # The ``.grad`` of this worker's tensors is lent to one holder at a time: a local backward
        # pass (to the leaves' accumulators, see _accumulate) or an optimizer step (see
        # lending_grad). ``outbox``: the gradient messages of the pass that holds it, found from
        # any thread the autograd engine runs a recv node's backward in.
        self.grad_lock = threading.RLock()
        self.outbox: Any = None  # the _Outbox of the pass holding grad_lock (rallypoint.rpc.autograd)
        self.param_passes = ParameterPasses(agent.info.name)

    @property
    def agent(self) -> Any:
        """The worker's agent."""
        return _alive(self._agent)

    def __len__(self) -> int:
        with self._lock:
            return len(self._contexts)

    def ids(self) -> list[int]:
        """The ids of the contexts alive here."""
        with self._lock:
            return list(self._contexts)

    def new(self) -> DistContext:
        """A fresh context started by this worker."""
        ctx_id = (self.agent.info.id << 40) | next(self._counter)
        with self._lock:
            ctx = self._contexts[ctx_id] = DistContext(self.agent, ctx_id)
        return ctx

    def join(self, ctx_id: Any, src: str) -> DistContext:
        """The context of a received message (created on its first message here)."""
        if not isinstance(ctx_id, int) or isinstance(ctx_id, bool) or not 0 <= ctx_id < 1 << 62:
            raise SerializationError(f"malformed autograd context id received by {self.agent.info.name}")
        with self._lock:
            ctx = self._contexts.get(ctx_id)
            if ctx is None:
                if ctx_id in self._released:
                    raise RpcError(
                        f"distributed autograd context {ctx_id} was already released on {self.agent.info.name}; "
                        "send calls of a context only inside its `with context()` block"
                    )
                ctx = self._contexts[ctx_id] = DistContext(self.agent, ctx_id)
        ctx.add_peer(src)
        return ctx

    def get(self, ctx_id: int) -> DistContext:
        """A context alive here.

        Raises:
            RpcError: unknown here, or already released.
        """
        with self._lock:
            ctx = self._contexts.get(ctx_id)
            released = ctx_id in self._released
        if ctx is None:
            state = "was released" if released else "is unknown"
            raise RpcError(f"distributed autograd context {ctx_id} {state} on {self.agent.info.name}")
        return ctx

    def release(self, ctx_id: int, src: str | None) -> None:
        """Drop a context here and tell the workers it reached (except ``src``, who told us)."""
        with self._lock:
            ctx = self._contexts.pop(ctx_id, None)
            self._released[ctx_id] = None
            while len(self._released) > _RELEASED_KEPT:
                self._released.popitem(last=False)
        if ctx is None:
            return
        with ctx.lock:
            peers = sorted(ctx.peers - {src or ""})
            ctx.sends.clear()
            ctx.grads.clear()
        for name in peers:
            # fire and forget: a dead peer has nothing left to release
            with contextlib.suppress(RpcError, ValueError):
                peer = self.agent.worker(name)
                fut = self.agent.send(peer, {"op": "ad_release", "ctx": ctx_id}, {}, None, f"release context {ctx_id}")
                fut._add_callback(lambda f: f.exception())


def _alive(ref: weakref.ref[Any]) -> Any:
    agent = ref()
    if agent is None:
        raise RpcError("the RPC agent of this distributed autograd context is gone (RPC was shut down)")
    return agent


_TABLES: weakref.WeakKeyDictionary[Any, ContextTable] = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def table(agent: Any) -> ContextTable:
    """The context table of ``agent``."""
    with _TABLES_LOCK:
        found = _TABLES.get(agent)
        if found is None:
            found = _TABLES[agent] = ContextTable(agent)
        return found
