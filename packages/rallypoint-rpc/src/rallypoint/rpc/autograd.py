"""Distributed autograd: ``backward`` across the workers that an RPC-using forward pass went through.

Shaped like ``torch.distributed.autograd``::

    from rallypoint.rpc import autograd as dist_autograd

    with dist_autograd.context() as ctx_id:
        loss = model_rref.rpc_sync().forward(x).sum()
        dist_autograd.backward(ctx_id, [loss])
        grads = dist_autograd.get_gradients(ctx_id)  # this worker's share, keyed by tensor

How it works. Every RPC sent inside a context carries the context's id. A tensor that requires
grad and travels in such a message (an argument or a result) is *recorded* by its sender (kept,
with its graph, under a send id) and arrives wrapped in a *recv* node: a differentiable
identity whose backward sends the gradient back to the sender, where the backward pass resumes
from the recorded tensor. Gradients that reach leaves are added to the context's gradients on
the leaf's worker and never left in ``.grad``, so concurrent contexts (trainers) never mix. The
leaves' accumulators run as in a local ``backward`` (with their hooks: DDP averages its
gradients there, as under torch's distributed autograd); each worker runs one local pass at a
time, and takes the gradients out of ``.grad`` when it ends.
A gradient message is answered once the gradients it leads to have come back from every worker
it reached, so :func:`backward` returns when the gradients of every worker's received tensors
are computed; each worker computes its own parameters' gradients after its reply left
(:mod:`rallypoint.rpc.param_pass`), and :func:`get_gradients` (and so the distributed
optimizer's step) waits for them. Contexts are
released on every worker they reached when ``with context()`` exits, and when a backward pass
fails (a worker died: the error names it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from rallypoint.rpc.contexts import RECV_ANCHOR as _MARK
from rallypoint.rpc.contexts import ContextTable, DistContext, table
from rallypoint.rpc.current import current_agent
from rallypoint.rpc.errors import RpcError, SerializationError, WorkerUnavailable
from rallypoint.rpc.gradctx import ACTIVE, Active
from rallypoint.rpc.param_pass import plan_pass

__all__ = ["UnavailableInBackward", "backward", "context", "get_gradients", "lending_grad"]


class UnavailableInBackward(WorkerUnavailable):
    """A worker the backward pass needed is gone, found by another worker down the chain.

    A :class:`~rallypoint.rpc.WorkerUnavailable` (``worker`` names the dead worker) that keeps
    its type on its way back to the worker that called ``backward``.
    """

    def __init__(self, message: str, worker: str = "") -> None:
        RpcError.__init__(self, message, worker)
        self.worker = worker

    def __str__(self) -> str:
        return str(self.args[0])


# ------------------------------------------------------------------------------------------ API
@contextlib.contextmanager
def context() -> Iterator[int]:
    """Start a distributed autograd context; yields its id.

    RPCs sent in the block (and the calls they make in turn) record the tensors requiring grad
    that they carry. On exit the context is released on every worker it reached.
    """
    agent = current_agent()
    contexts = table(agent)
    ctx = contexts.new()
    token = ACTIVE.set(Active(agent, ctx))
    try:
        yield ctx.id
    finally:
        ACTIVE.reset(token)
        contexts.release(ctx.id, None)


@contextlib.contextmanager
def lending_grad() -> Iterator[None]:
    """Hold the ``.grad`` of this worker's tensors: no backward pass or other holder uses it meanwhile.

    For code that places a context's gradients in ``.grad`` for a while (an optimizer's step)
    and puts the previous ones back before it leaves the block.
    """
    with table(current_agent()).grad_lock:
        yield


def get_gradients(context_id: int) -> dict[torch.Tensor, torch.Tensor]:
    """The gradients this worker holds in a context: ``{leaf tensor: gradient}`` (a copy of the mapping).

    Waits for the parameter gradients this worker still computes in the context (a backward
    pass started elsewhere returns before them: see :mod:`rallypoint.rpc.param_pass`).

    Raises:
        RpcError: the context is unknown on this worker, or released; computing its parameter
            gradients here failed (the error says how).
    """
    ctx = table(current_agent()).get(context_id)
    failed = ctx.pending.wait()  # the parameter passes still running here (see rallypoint.rpc.param_pass)
    if failed is not None:
        raise RpcError(
            f"computing the parameter gradients of context {context_id} on {ctx.agent.info.name} failed: "
            f"{type(failed).__name__}: {failed}"
        ) from failed
    with ctx.lock:
        return dict(ctx.grads)


def backward(context_id: int, roots: Sequence[torch.Tensor], retain_graph: bool = False) -> None:
    """Run the backward pass from ``roots`` (scalars) across every worker the context reached.

    Returns once the gradients are in the context on this worker; on the others, the gradients
    of their parameters may still be computing, and :func:`get_gradients` there (which
    ``DistributedOptimizer.step`` uses) waits for them (see :mod:`rallypoint.rpc.param_pass`).
    Graphs stay alive until the context exits (``retain_graph`` is accepted for torch
    compatibility: backward may run again in the same context).

    Raises:
        ValueError: a root is not a scalar that requires grad.
        RpcError: the context is unknown here; a worker failed during the pass (the error names
            it, and the context is released on every worker).
    """
    del retain_graph
    agent = current_agent()
    contexts = table(agent)
    ctx = contexts.get(context_id)
    tensors = list(roots)
    for root in tensors:
        if not isinstance(root, torch.Tensor) or root.numel() != 1 or not root.requires_grad:
            raise ValueError("backward roots must be scalar tensors that require grad (a loss)")
    try:
        run_backward(ctx, tensors, [torch.ones_like(root) for root in tensors])
    except BaseException:
        contexts.release(context_id, None)
        raise


# ------------------------------------------------------------------------------------ machinery
def run_backward(
    ctx: DistContext, roots: list[torch.Tensor], grads: list[torch.Tensor], reply_to: str | None = None
) -> list[dict[str, Any]]:
    """Backward from ``roots`` on this worker; returns when every gradient message it sent is done.

    ``reply_to``: the worker whose gradient message started this pass. When every gradient
    message of the pass goes to that worker, none is sent: they are returned (``{"ctx", "send",
    "grad"}`` entries) to travel in the reply, and the worker resumes its pass from them when the
    reply comes (see :func:`resume_returned`). That saves two messages per hop back (the
    gradient's own call and its reply) in every chain of workers.
    """
    outputs, grad_outputs = [], []
    for root, grad in zip(roots, grads, strict=True):
        if root.grad_fn is None:
            if root.requires_grad:  # a leaf sent as such: its gradient is the one that came back
                ctx.accumulate(root, grad)
            continue
        outputs.append(root)
        grad_outputs.append(grad)
    if not outputs:
        return []
    contexts = table(ctx.agent)
    # Resumed for another worker, the pass returns once the gradients that leave this worker are
    # on their way; this worker's parameters get theirs after the reply (see param_pass).
    plan = plan_pass(outputs, _MARK, split=reply_to is not None)
    outbox = _Outbox(reply_to)
    try:
        with contexts.grad_lock:
            previous, contexts.outbox = contexts.outbox, outbox
            try:
                if plan.branch:
                    found = torch.autograd.grad(
                        outputs, [*plan.anchors, *plan.branch], grad_outputs, retain_graph=True, allow_unused=True
                    )
                    computed: list[torch.Tensor | None] = list(found)
                else:
                    computed = _accumulate(outputs, grad_outputs, plan.leaves)
            finally:
                contexts.outbox = previous
    finally:
        error = outbox.finish()  # outside the lock: the passes it waits for may come back here
    if error is not None:
        raise error
    if plan.branch:
        started = [(e, g) for e, g in zip(plan.branch, computed[len(plan.anchors) :], strict=True) if g is not None]
        if started:
            contexts.param_passes.submit(ctx.pending, lambda: _parameter_pass(contexts, ctx, started, plan.own))
        return outbox.returned
    for leaf, got in zip(plan.leaves, computed, strict=True):
        if got is not None and not getattr(leaf, _MARK, False):
            ctx.accumulate(leaf, got)
    return outbox.returned


def _parameter_pass(
    contexts: ContextTable, ctx: DistContext, started: list[tuple[Any, torch.Tensor]], own: list[torch.Tensor]
) -> None:
    """Part 2 of a split pass: from its branch point to this worker's own leaves; sends nothing."""
    with contexts.grad_lock:
        computed = _accumulate([e for e, _ in started], [g for _, g in started], own)
    for leaf, got in zip(own, computed, strict=True):
        if got is not None:
            ctx.accumulate(leaf, got)


def _accumulate(
    outputs: Sequence[Any], grad_outputs: list[torch.Tensor], leaves: list[torch.Tensor]
) -> list[torch.Tensor | None]:
    """The local pass from ``outputs`` (tensors or gradient edges): the gradient of each leaf (``None``: not reached).

    The leaves' accumulators run, as in ``loss.backward()``, so that what hooks them runs too:
    DDP's reducer averages its parameters' gradients across its group there (and writes the
    average back). For the pass, each leaf's ``.grad`` is lent out empty; what the pass left
    in it is taken and the leaf's own ``.grad`` put back (call with the worker's ``grad_lock`` held).
    """
    own = [leaf.grad for leaf in leaves]
    for leaf in leaves:
        leaf.grad = None
    try:
        torch.autograd.backward(outputs, grad_outputs, retain_graph=True, inputs=leaves)
        taken: list[torch.Tensor | None] = [leaf.grad for leaf in leaves]
        return taken
    finally:
        for leaf, grad in zip(leaves, own, strict=True):
            leaf.grad = grad


class _Outbox:
    """The gradient messages of one local backward pass, sent and then waited for.

    Each message leaves as soon as the next one is made (they run in parallel); the last one
    when the local pass is done. When that one is the only message, it is sent and waited for
    in this thread (``RpcAgent.call``: its reply wakes no other thread). Messages to
    ``reply_to`` are kept back while every message goes there: they are then :attr:`returned`
    for the reply instead (a message to any other worker sends them too, at once, so no
    branch of the pass waits for another).
    """

    def __init__(self, reply_to: str | None = None) -> None:
        self.held: tuple[Any, Any, dict[str, Any], dict[str, Any], str] | None = None
        self.sent: list[Any] = []
        self.reply_to = reply_to
        self.returned: list[dict[str, Any]] = []
        self._kept: list[tuple[Any, Any, dict[str, Any], dict[str, Any], str]] = []

    def add(self, agent: Any, peer: Any, header: dict[str, Any], values: dict[str, Any], what: str) -> None:
        """A gradient message of this pass (the one held before leaves now)."""
        message = (agent, peer, header, values, what)
        if peer.name == self.reply_to and self.held is None and not self.sent:
            self._kept.append(message)
            return
        for kept in self._kept:  # the pass branches out: every message goes on its own
            self._send(kept)
        self._kept.clear()
        self._flush()
        self.held = message

    def _send(self, message: tuple[Any, Any, dict[str, Any], dict[str, Any], str]) -> None:
        agent, peer, header, values, what = message
        # the default RPC timeout: it covers the backward pass this message starts on every worker
        self.sent.append((agent, agent.send(peer, header, values, None, what, broadcasts=True)))

    def _flush(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            self._send(held)

    def finish(self) -> BaseException | None:
        """Send what is held and wait for every message; returns the first failure (``None``: all done).

        Gradients that come back in a reply are resumed from here, in this thread.
        """
        first: BaseException | None = None
        if self._kept:  # every message of the pass goes to reply_to: they travel in the reply
            self.returned = [{"ctx": h["ctx"], "send": h["send"], "grad": v["grad"]} for _, _, h, v, _ in self._kept]
            self._kept.clear()
            return None
        held = self.held
        try:
            if held is not None and not self.sent:
                self.held = None
                agent, peer, header, values, what = held
                reply = agent.call(peer, header, values, None, what, broadcasts=True)
                self.returned += resume_returned(agent, reply, self.reply_to)
            else:
                self._flush()
        except BaseException as exc:  # noqa: BLE001 - the first failure is raised once all are done
            first = exc
        for agent, fut in self.sent:
            try:
                self.returned += resume_returned(agent, fut.wait(), self.reply_to)
            except BaseException as exc:  # noqa: BLE001 - the first failure is raised once all are done
                first = first or exc
        return first


def resume_returned(agent: Any, returned: Any, reply_to: str | None = None) -> list[dict[str, Any]]:
    """Resume the backward pass here from the gradients a reply brought back (see :func:`run_backward`).

    ``returned``: the reply of a gradient message: ``None``, or ``{"ctx", "send", "grad"}`` entries.
    Returns the gradients for ``reply_to`` that the resumed passes kept back in turn.
    """
    if returned is None:
        return []
    if not isinstance(returned, list):
        raise SerializationError(f"malformed reply to a gradient message received by {agent.info.name}")
    back: list[dict[str, Any]] = []
    for entry in returned:
        if not isinstance(entry, dict):
            raise SerializationError(f"malformed reply to a gradient message received by {agent.info.name}")
        ctx, sent, grad = _gradient_for(agent, entry.get("ctx"), entry.get("send"), entry.get("grad"))
        back += run_backward(ctx, [sent], [grad], reply_to)
    return back


def _gradient_for(agent: Any, ctx_id: Any, send_id: Any, grad: Any) -> tuple[DistContext, torch.Tensor, torch.Tensor]:
    """The context, the recorded tensor and the gradient (checked) of one gradient for ``send_id``."""
    if not isinstance(ctx_id, int) or isinstance(ctx_id, bool):
        raise SerializationError(f"malformed autograd message received by {agent.info.name}")
    ctx = table(agent).get(ctx_id)
    with ctx.lock:
        sent = ctx.sends.get(send_id) if isinstance(send_id, int) else None
    if sent is None or not isinstance(grad, torch.Tensor) or grad.shape != sent.shape:
        raise SerializationError(f"gradient for unknown tensor {send_id!r} of context {ctx_id} on {agent.info.name}")
    grad = grad.to(device=sent.device, dtype=sent.dtype)
    if not grad.is_contiguous():
        # It travelled as the memory it spans (a broadcast view: the gradient of a sum). Laid out in
        # full here, once: a matrix product cannot read a view whose elements share memory and
        # would copy it itself, at every product of the pass.
        grad = grad.contiguous()
    return ctx, sent, grad


class _Recv(torch.autograd.Function):
    """A received tensor: identity forward; backward sends the gradient back to the sender."""

    @staticmethod
    def forward(fctx: Any, anchor: torch.Tensor, value: torch.Tensor, route: Any) -> torch.Tensor:
        fctx.route = route
        return value.view_as(value)

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx, sender, send_id = fctx.route
        _send_gradient(ctx, sender, send_id, grad)
        return None, None, None


def _send_gradient(ctx: DistContext, sender: str, send_id: int, grad: torch.Tensor) -> None:
    agent = ctx.agent
    peer = agent.worker(sender)
    header = {"op": "ad_grad", "ctx": ctx.id, "send": send_id}
    values = {"grad": grad}  # a broadcast gradient (that of a sum) travels as the memory it spans
    what = f"backward of context {ctx.id} (gradient to {sender})"
    outbox = table(agent).outbox
    if outbox is None:  # not in a distributed pass (a plain ``backward``): wait here (the default RPC timeout)
        resume_returned(agent, agent.call(peer, header, values, None, what, broadcasts=True))
    else:
        outbox.add(agent, peer, header, values, what)


# ------------------------------------------------------------------------ hooks of the agent
def received(agent: Any, value: torch.Tensor, tag: Any) -> torch.Tensor:
    """A tensor received with an ``ad`` tag: wrapped in a recv node of its context."""
    if (
        not isinstance(tag, list)
        or len(tag) != 3
        or not isinstance(tag[1], str)
        or not isinstance(tag[2], int)
        or isinstance(tag[2], bool)
    ):
        raise SerializationError(f"malformed autograd tag received by {agent.info.name}")
    ctx_id, sender, send_id = tag
    if sender not in agent.peers:
        raise SerializationError(f"{agent.info.name} received a tensor recorded by unknown worker {sender!r}")
    ctx = table(agent).join(ctx_id, sender)
    out: torch.Tensor = _Recv.apply(ctx.anchor, value, (ctx, sender, send_id))  # type: ignore[no-untyped-call]
    return out


@contextlib.contextmanager
def serving(agent: Any, ctx_id: Any, src: str) -> Iterator[None]:
    """Run a received call inside its context (its replies and calls are recorded there)."""
    ctx = table(agent).join(ctx_id, src)
    token = ACTIVE.set(Active(agent, ctx))
    try:
        yield
    finally:
        ACTIVE.reset(token)


def handle(agent: Any, tree: dict[str, Any], grad: Any) -> list[dict[str, Any]] | None:
    """Run an ``ad_grad`` (resume the backward pass here) or ``ad_release`` message.

    Returns what the reply carries: the gradients for the sender that the pass kept back (see
    :func:`run_backward`).
    """
    contexts = table(agent)
    ctx_id = tree.get("ctx")
    if not isinstance(ctx_id, int) or isinstance(ctx_id, bool):
        raise SerializationError(f"malformed autograd message received by {agent.info.name}")
    if tree.get("op") == "ad_release":
        contexts.release(ctx_id, str(tree.get("src")))
        return None
    ctx, sent, grad = _gradient_for(agent, ctx_id, tree.get("send"), grad)
    try:
        return run_backward(ctx, [sent], [grad], reply_to=str(tree.get("src"))) or None
    except UnavailableInBackward:
        contexts.release(ctx_id, None)
        raise
    except WorkerUnavailable as exc:
        contexts.release(ctx_id, None)
        found = f"{exc} (found by {agent.info.name} in the backward pass of context {ctx_id})"
        raise UnavailableInBackward(found, exc.worker) from None
    except BaseException:
        contexts.release(ctx_id, None)
        raise
