"""A parameter server: trainers pull weights and push gradients; the result equals a single-process run.

worker0 hosts a ``ParameterServer`` (linear regression weights) and drives two trainers,
worker1 and worker2. Each step, every trainer pulls the weights, computes the gradient on its
own data shard and pushes it; the server applies the average once both gradients are in
(synchronous SGD) and answers each push with the new weights. worker0 then runs the same
training in one process and compares. Run with ``rallypoint run examples/rpc/param_server.toml``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from pathlib import Path

import torch

from rallypoint import rpc

TRUE_W = torch.tensor([2.0, -3.0, 0.5], dtype=torch.float64)
LR = 0.1


def shard(trainer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of one trainer (the same on every worker that asks)."""
    gen = torch.Generator().manual_seed(100 + trainer)
    x = torch.randn(64, 3, generator=gen, dtype=torch.float64)
    return x, x @ TRUE_W


def gradient(w: torch.Tensor, trainer: int) -> torch.Tensor:
    """Gradient of the mean squared error on a trainer's shard."""
    x, y = shard(trainer)
    return 2 * x.T @ (x @ w - y) / len(y)


@rpc.expose
class ParameterServer:
    """Weights, updated with the average gradient of all trainers once per step."""

    def __init__(self, trainers: int) -> None:
        self.w = torch.zeros(3, dtype=torch.float64)
        self.trainers = trainers
        self.grads: dict[int, torch.Tensor] = {}
        self.step = 0
        self.cond = threading.Condition()

    def weights(self) -> torch.Tensor:
        """The current weights."""
        with self.cond:
            return self.w.clone()

    def push(self, step: int, trainer: int, grad: torch.Tensor) -> torch.Tensor:
        """Add a trainer's gradient for ``step``; returns the weights after that step."""
        with self.cond:
            self.grads[trainer] = grad
            if len(self.grads) == self.trainers:
                total = sum(self.grads[t] for t in sorted(self.grads))
                self.w = self.w - LR * total / self.trainers
                self.grads, self.step = {}, self.step + 1
                self.cond.notify_all()
            while self.step <= step:
                self.cond.wait()
            return self.w.clone()


@rpc.expose
def train(ps: rpc.RRef[ParameterServer], trainer: int, steps: int) -> int:
    """A trainer's loop: pull, compute, push."""
    w = ps.rpc_sync().weights()
    for step in range(steps):
        w = ps.rpc_sync().push(step, trainer, gradient(w, trainer))
    return steps


def single_process(trainers: int, steps: int) -> torch.Tensor:
    """The same training without RPC."""
    w = torch.zeros(3, dtype=torch.float64)
    for _ in range(steps):
        total = sum(gradient(w, t) for t in range(trainers))
        w = w - LR * total / trainers
    return w


def main() -> None:
    """worker0 serves the parameters and drives; worker1 and worker2 train."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"worker{rank}")
    if rank == 0:
        trainers = world - 1
        ps = rpc.RRef(ParameterServer(trainers))
        futures = [rpc.rpc_async(f"worker{t + 1}", train, args=(ps, t, args.steps)) for t in range(trainers)]
        for fut in futures:
            fut.wait()
        distributed = ps.local_value().weights()
        reference = single_process(trainers, args.steps)
        result = {
            "weights": distributed.tolist(),
            "single_process": reference.tolist(),
            "max_abs_diff": float((distributed - reference).abs().max()),
            "true_weights": TRUE_W.tolist(),
        }
        print(json.dumps(result))
        if args.out is not None:
            (args.out / "param_server.json").write_text(json.dumps(result))
    rpc.shutdown()


if __name__ == "__main__":
    main()
