"""The parameters' share of a backward pass, computed after the pass's gradients went back.

When a gradient message from another worker resumes the backward pass here, that worker waits
for the gradients that flow back to it (those of the tensors it sent), not for the gradients of
this worker's own parameters: those stay here, in the context. Where the graph allows it without
computing anything twice, the pass runs in two parts (:func:`plan_pass`):

1. the part towards the tensors received from other workers (their recv nodes send or return
   those gradients), which also keeps the gradient that arrives where the paths to this
   worker's parameters branch off; the reply leaves as soon as it is done;
2. from that branch point, the part towards this worker's parameters, queued here and run by
   one thread per worker (:class:`ParameterPasses`) while the reply travels and the caller goes
   on. Their accumulators (and what hooks them: DDP's reducer) run there, in one pass.

torch's engine computes only the outputs of a node that lead to what a pass asks for, so the
node at the branch point runs once in each part, for different outputs. For a layer
``y = x W^T + b`` called remotely, part 1 is ``dL/dx`` (one matrix product) and part 2 ``dL/dW``
(the other one) and ``dL/db``: the caller's ``backward`` no longer waits for ``dL/dW``. A graph
whose paths to the parameters branch off at several nodes (a stack of layers) would need part 2
to start at each of them separately; it runs in one pass, as before.

Nothing reads a context's gradients before its parts 2 are done: :class:`Pending` counts them
per context, and :func:`rallypoint.rpc.autograd.get_gradients` (which the distributed
optimizer's step uses) waits for it; an error in part 2 is raised there.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["ParameterPasses", "PassPlan", "Pending", "plan_pass"]

_log = logging.getLogger(__name__)


class Pending:
    """The parameter passes of one context that are queued or running on this worker."""

    def __init__(self) -> None:
        self._state = threading.Condition()
        self._count = 0
        self._error: BaseException | None = None

    def add(self) -> None:
        """One more pass to wait for (called before the reply that lets the caller go on leaves)."""
        with self._state:
            self._count += 1

    def done(self, error: BaseException | None = None) -> None:
        """A pass ended (``error``: how it failed; the first failure is kept)."""
        with self._state:
            self._count -= 1
            if error is not None and self._error is None:
                self._error = error
            self._state.notify_all()

    def wait(self) -> BaseException | None:
        """Wait until no pass is left; returns the first failure (``None``: all succeeded)."""
        with self._state:
            while self._count:
                self._state.wait()
            return self._error


class ParameterPasses:
    """One worker's queue of parameter passes, run in order by a thread of their own.

    One thread (started on the first pass) keeps the passes in the order their messages came,
    as the single local pass did; its matrix products release the GIL, so it runs beside the
    worker's RPC threads (the next forward pass, the next message).
    """

    def __init__(self, worker: str) -> None:
        self._worker = worker
        self._queue: queue.SimpleQueue[tuple[Pending, Callable[[], None]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, pending: Pending, work: Callable[[], None]) -> None:
        """Queue ``work`` (one parameter pass); ``pending`` is counted now and told when it ends."""
        pending.add()
        self._queue.put((pending, work))
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rpc-param-grads", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            pending, work = self._queue.get()
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - kept for whoever reads the context's gradients
                _log.warning("%s: computing parameter gradients failed: %s: %s", self._worker, type(exc).__name__, exc)
                pending.done(exc)
            else:
                pending.done()


@dataclass
class PassPlan:
    """How a local backward pass runs (see :func:`plan_pass`).

    Attributes:
        anchors: the recv anchors the pass reaches (the received tensors' side).
        own: this worker's own leaves it reaches (its parameters, its inputs that require grad).
        branch: where part 2 starts: the gradient edges into the one node at which the paths to
            ``own`` branch off the paths to ``anchors``; empty: the pass runs in one part.
    """

    anchors: list[torch.Tensor] = field(default_factory=list)
    own: list[torch.Tensor] = field(default_factory=list)
    branch: list[Any] = field(default_factory=list)

    @property
    def leaves(self) -> list[torch.Tensor]:
        """Every leaf the pass reaches."""
        return [*self.anchors, *self.own]


def plan_pass(outputs: Sequence[torch.Tensor], marker: str, *, split: bool) -> PassPlan:
    """The leaves ``outputs`` depend on and, with ``split``, where the parameters' part may start.

    ``marker``: the attribute of recv anchors. One walk over the graph: each node is noted with
    whether it leads to an anchor and whether it leads to one of this worker's own leaves. A
    node that leads to both, with an edge to a node that leads to own leaves only, is a branch
    point; with exactly one branch point (and an engine that takes gradient edges), the pass
    can be split there without computing any gradient twice.

    The walk holds the graph's node objects, not just their ids: Python's objects for autograd
    nodes are made on access and freed when unused, and a freed one's id can be given to the
    next node met (seen on Python 3.12 with a CUDA remote module: leaves lost).
    """
    nodes: dict[int, Any] = {}
    reach: dict[int, tuple[bool, bool]] = {}
    slots: dict[int, set[int]] = {}  # the output slots of each node that receive a gradient
    plan = PassPlan()
    stack: list[tuple[Any, bool]] = []
    for out in outputs:
        if out.grad_fn is not None:
            stack.append((out.grad_fn, False))
            slots.setdefault(id(out.grad_fn), set()).add(out.output_nr)
            nodes.setdefault(id(out.grad_fn), out.grad_fn)
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            a = b = False
            for nxt, _ in node.next_functions:
                if nxt is not None:
                    ra, rb = reach[id(nxt)]
                    a, b = a or ra, b or rb
            reach[key] = (a, b)
            continue
        if key in reach:
            continue
        nodes[key] = node  # kept alive while the walk lasts, so ids stay unique
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            mine = not getattr(variable, marker, False)
            (plan.own if mine else plan.anchors).append(variable)
            reach[key] = (not mine, mine)
            continue
        reach[key] = (False, False)  # replaced when its successors are done (the graph has no cycles)
        stack.append((node, True))
        for nxt, slot in node.next_functions:
            if nxt is not None:
                nodes.setdefault(id(nxt), nxt)
                slots.setdefault(id(nxt), set()).add(slot)
                if id(nxt) not in reach:
                    stack.append((nxt, False))
    if split and plan.anchors and plan.own and _edges_supported():
        own_only = (False, True)
        branching = [
            key
            for key, (a, b) in reach.items()
            if a and b and any(n is not None and reach[id(n)] == own_only for n, _ in nodes[key].next_functions)
        ]
        if len(branching) == 1:
            edge = torch.autograd.graph.GradientEdge
            plan.branch = [edge(nodes[branching[0]], slot) for slot in sorted(slots[branching[0]])]
    return plan


_EDGES: list[bool] = []


def _edges_supported() -> bool:
    """Whether this torch's engine takes gradient edges as the inputs and roots of a pass (checked once)."""
    if not _EDGES:
        try:
            leaf = torch.ones(2, requires_grad=True)
            mid = leaf * 2
            edge = torch.autograd.graph.get_gradient_edge(mid)
            (got,) = torch.autograd.grad([mid.sum()], [edge], retain_graph=True)
            torch.autograd.backward([edge], [got], inputs=[leaf])
            _EDGES.append(leaf.grad is not None and bool((leaf.grad == 2).all()))
        except (AttributeError, TypeError, RuntimeError):
            _EDGES.append(False)
    return _EDGES[0]
