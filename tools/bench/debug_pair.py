"""Measurement 3 of ``debug_overhead.py``: one rank of a two-rank Gloo group (issue #40).

``debug_overhead.py`` starts itself twice with ``--pair-rank 0|1``; both ranks run the same
side-by-side schedule (the harness's order is fixed by the settings), so every collective has its
peer; only rank 0 prints. Three pairs of sides:

* ``torch.distributed.all_reduce`` of 16 floats, through the flight record's wrapper or not;
* the rallypoint facade's ``all_reduce`` of 16 floats, with ``torch.distributed.all_reduce``
  wrapped or not (the facade issues torch's call asynchronously on Gloo and waits: its records
  complete through the work's future);
* a training step (a 256x256 matmul, then an all_reduce of its first 16 values) with the worker's
  debug hooks installed (faulthandler's dump handler and the flight record) or not.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import tempfile
from typing import Any

from tools.bench.harness import run_benchmark

__all__ = ["WorkMethods", "pair_main"]


class WorkMethods:
    """Puts a work class's own ``wait`` / ``is_completed`` back for the plain side, the hooks' for the recorded one.

    Once a recorded call has returned a work, the hooks have wrapped its class's methods, for
    every work of the class: a plain side would pay for them too.
    """

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.watched: tuple[Any, Any] | None = None

    def use(self, recorded: bool) -> None:
        """Install the hooks' methods (``recorded``) or the class's own, if not already there."""
        cls = self.cls
        current = cls.wait, cls.is_completed  # type: ignore[attr-defined]
        if self.watched is None:
            if not hasattr(current[0], "__wrapped__"):
                return  # not wrapped yet: the first recorded asynchronous call wraps them
            self.watched = current
        wanted = self.watched if recorded else (self.watched[0].__wrapped__, self.watched[1].__wrapped__)
        if current != wanted:
            cls.wait, cls.is_completed = wanted  # type: ignore[attr-defined]


def pair_main(args: argparse.Namespace, hooks: Any) -> int:
    """Run rank ``args.pair_rank`` of the measurement (the group's port is ``args.pair_port``)."""
    rank = args.pair_rank
    os.environ.update(
        {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
        | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(args.pair_port), "RALLYPOINT_COLLECTIVES_BACKEND": "gloo"}
    )
    import torch
    import torch.distributed as dist

    import rallypoint.collectives as rc

    rc.init()
    out = sys.stdout if rank == 0 else open(os.devnull, "w")  # noqa: SIM115 - closed with the process
    pair = argparse.Namespace(**{**vars(args), "number": max(1, args.number // 10), "json": None})
    plain = dist.all_reduce
    small = torch.ones(16)
    with tempfile.TemporaryDirectory() as tmp:
        recorded = hooks._wrap(hooks.FlightRecorder(os.path.join(tmp, f"rank_{rank}.flight")), "all_reduce", plain)
        try:
            c = run_benchmark(
                pair,
                lambda: recorded(small),
                lambda: plain(small),
                labels=("recorded", "plain"),
                title="debug overhead: flight record per collective (all_reduce of 16 floats, 2 ranks, gloo)",
                out=out,
            )
            print(f"flight record cost per collective, 2 ranks: {(c.a.median - c.b.median) * 1e6:.2f} us\n", file=out)

            methods = WorkMethods(dist.Work)

            def facade(on: bool) -> None:
                methods.use(on)
                dist.all_reduce = recorded if on else plain
                rc.all_reduce(small)

            c = run_benchmark(
                pair,
                lambda: facade(True),
                lambda: facade(False),
                labels=("recorded", "plain"),
                title="debug overhead: flight record per facade all_reduce (16 floats, 2 ranks, gloo)",
                out=out,
            )
            cost = (c.a.median - c.b.median) * 1e6
            print(f"flight record cost per facade collective, 2 ranks: {cost:.2f} us\n", file=out)
            _steps(args, hooks, tmp, recorded, plain, methods, out)
        finally:
            dist.all_reduce = plain
            methods.use(False)
    dist.barrier()
    dist.destroy_process_group()
    out.flush()
    return 0


def _steps(
    args: argparse.Namespace, hooks: Any, tmp: str, recorded: Any, plain: Any, methods: WorkMethods, out: Any
) -> None:
    """The training step with the debug hooks installed or not (installed and removed between sides).

    The hooked side has the work class's ``wait`` wrapped too (as in a worker that made an
    asynchronous call), which torch's synchronous all_reduce calls.
    """
    import torch
    import torch.distributed as dist

    a = torch.randn(256, 256)
    state = {"hooked": False}

    def step(hooked: bool) -> None:
        if hooked != state["hooked"]:
            if hooked:
                hooks._stacks(tmp, str(args.pair_rank))
                dist.all_reduce = recorded
            else:
                faulthandler.unregister(hooks.DUMP_SIGNAL)
                dist.all_reduce = plain
            methods.use(hooked)
            state["hooked"] = hooked
        y = a @ a
        dist.all_reduce(y[0, :16])

    steps = argparse.Namespace(**{**vars(args), "number": max(1, args.number // 20), "json": None})  # ~1 ms a step
    run_benchmark(
        steps,
        lambda: step(True),
        lambda: step(False),
        labels=("debuggable", "plain"),
        title="debug overhead: training step (256x256 matmul + all_reduce, 2 ranks, gloo), hooks installed or not",
        out=out,
    )
    print(file=out, flush=True)
