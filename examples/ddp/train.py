"""Elastic DDP training over Gloo: a small model, synthetic data, checkpoints, resume.

A plain torchrun-style script (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... from the
environment); without those variables it runs as a single process, which is the reference the
multi-host tests compare with.

What makes the result independent of how many workers ran it, and of restarts:

* the data of step ``s`` is drawn from a generator seeded with ``seed + s``: one *global* batch
  of ``--global-batch`` samples; each of the ``W`` workers takes its contiguous ``1/W`` slice;
* DDP averages the gradients of equal slices, which is the gradient of the mean loss over the
  global batch: the same update a single process makes on the whole batch (float64, so the
  reduction order changes the result by far less than 1e-5);
* worker rank 0 writes a checkpoint (step, model, optimizer) every ``--ckpt-every`` steps,
  atomically (write, then rename); every worker resumes from the newest one when it starts.

So a run on 2 hosts x 2 workers, a run that lost a worker or a host halfway, and one process
end with the same weights. Rank 0 appends one JSON line per step to ``OUT/progress.jsonl``
(step, wall time, world size, restart count, round) and writes ``OUT/final.json`` (the
weights); every worker appends a line to ``OUT/starts.jsonl`` when it starts (rank, host,
world size, resumed step): the tests' figures come from these.

    rallypoint run --nnodes 2 --nproc-per-node 2 ... examples/ddp/train.py --out /shared/ddp
    python examples/ddp/train.py --out /tmp/ref          # the single-process reference
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 8


def make_model(seed: int) -> nn.Module:
    """The model, initialised from ``seed`` (the same on every worker)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1)).double()


def global_batch(seed: int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of ``step``: the same on every worker, whatever the world size."""
    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(size, FEATURES, generator=gen, dtype=torch.float64)
    true_w = torch.linspace(-1.0, 1.0, FEATURES, dtype=torch.float64)
    y = torch.sin(x @ true_w).unsqueeze(1) + 0.01 * torch.randn(size, 1, generator=gen, dtype=torch.float64)
    return x, y


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line (one ``write`` of an ``O_APPEND`` file: lines never interleave)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def latest_checkpoint(ckpt_dir: Path) -> dict[str, Any] | None:
    """The newest complete checkpoint, or ``None``."""
    done = sorted(ckpt_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    return torch.load(done[-1], weights_only=True) if done else None


def save_checkpoint(ckpt_dir: Path, step: int, model: nn.Module, optim: torch.optim.Optimizer) -> None:
    """Write ``step_N.pt`` atomically: a crash while writing leaves the previous one the newest."""
    tmp = ckpt_dir / f".step_{step}.{os.getpid()}.tmp"
    torch.save({"step": step, "model": model.state_dict(), "optim": optim.state_dict()}, tmp)
    os.replace(tmp, ckpt_dir / f"step_{step}.pt")


def stop_together(notice: str | None, distributed: bool) -> str | None:
    """The preemption notice any worker got (a signal name), so that all stop after the same step.

    ``notice``: this worker's own (``None``: none yet). The ranks share the signal's number, so
    rank 0 can name it even when the notice reached another host first.
    """
    if not distributed:
        return notice
    flag = torch.tensor([signal.Signals[notice].value if notice else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    number = int(flag.item())
    return signal.Signals(number).name if number else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="shared directory: checkpoints, progress, weights")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--global-batch", type=int, default=12, help="samples per step, split over the workers")
    parser.add_argument("--ckpt-every", type=int, default=5, help="checkpoint every K steps")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds each step takes at least (compute)")
    parser.add_argument("--crash-at-step", type=int, default=None, help="rank --crash-rank exits 1 at this step")
    parser.add_argument("--crash-rank", type=int, default=1)
    parser.add_argument(
        "--checkpoint-on-preemption",
        action="store_true",
        help="on a preemption notice (rallypoint.agent.preemption), checkpoint after the step and stop",
    )
    parser.add_argument(
        "--pg-timeout", type=float, default=None, help="seconds a collective may wait (torch's default: 30 min)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train (resuming from the newest checkpoint), then write the final weights."""
    args = parse_args(argv)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        timeout = {"timeout": timedelta(seconds=args.pg_timeout)} if args.pg_timeout else {}
        dist.init_process_group("gloo", **timeout)
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} does not split over {world} workers")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = args.out / "ckpt"
    ckpt_dir.mkdir(exist_ok=True)

    model = make_model(args.seed)
    optim = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    ckpt = latest_checkpoint(ckpt_dir)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
        start = int(ckpt["step"])
    net: nn.Module = DistributedDataParallel(model) if distributed else model
    rnd = int(os.environ.get("RALLYPOINT_ROUND", "0"))
    info = {"rank": rank, "world": world, "host": socket.gethostname(), "restart": restart, "round": rnd}
    append_line(args.out / "starts.jsonl", {**info, "resumed": start, "t": time.time()})

    per = args.global_batch // world
    preempted = None
    if args.checkpoint_on_preemption:
        from rallypoint.agent.preemption import preempted, preemption_signal, watch

        watch()  # from here on a notice (SIGTERM; SIGUSR2 under Slurm) sets a flag instead of ending the worker
    for step in range(start, args.steps):
        began = time.monotonic()
        if args.crash_at_step == step and rank == args.crash_rank and not (args.out / "crashed").exists():
            (args.out / "crashed").write_text(f"rank {rank} crashed at step {step}\n")
            os._exit(1)
        x, y = global_batch(args.seed, step, args.global_batch)
        x, y = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
        optim.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        optim.step()
        if rank == 0:
            if (step + 1) % args.ckpt_every == 0:
                save_checkpoint(ckpt_dir, step + 1, model, optim)
            append_line(args.out / "progress.jsonl", {**info, "step": step + 1, "t": time.time()})
        notice = None
        if preempted is not None:
            notice = stop_together(preemption_signal() if preempted() else None, distributed)
        if notice is not None:
            if rank == 0:
                save_checkpoint(ckpt_dir, step + 1, model, optim)
                append_line(args.out / "preempted.jsonl", {**info, "step": step + 1, "signal": notice})
            sys.stdout.flush()
            os._exit(0)
        time.sleep(max(0.0, args.step_time - (time.monotonic() - began)))

    if rank == 0:
        weights = [v.flatten().tolist() for v in model.state_dict().values()]
        (args.out / "final.json").write_text(json.dumps([w for part in weights for w in part]))
    if distributed:
        dist.destroy_process_group()


def run() -> None:
    """``main()``, exiting at once on an error.

    A worker whose collective failed (a peer died: "connection reset by peer") can hang in the
    interpreter's shutdown, in the process group's destructor, until its agent stops it. Exiting
    with ``os._exit`` after printing the error tells the agent at once.
    """
    try:
        main()
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            raise
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1)


if __name__ == "__main__":
    run()
