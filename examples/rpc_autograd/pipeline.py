"""A two-stage pipeline of ``RemoteModule``s: stage 1 on worker1, stage 2 on worker2, driven by worker0.

Each batch is split in micro-batches; stage 1 runs them as they come (``forward_async``), stage 2
takes each one's output. ``backward`` in a distributed autograd context sends the gradients back
through both stages, and ``DistributedOptimizer`` steps both owners in parallel. worker0 then
trains the same two stages in one process, from the same initial weights, and compares. Run
with ``rallypoint run examples/rpc_autograd/pipeline.toml``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch import nn

from rallypoint import rpc
from rallypoint.rpc import autograd as dist_autograd

MICRO_BATCHES = 4


@rpc.expose
class Stage(nn.Module):
    """A linear layer with an activation, initialised from a seed."""

    def __init__(self, seed: int, n_in: int, n_out: int, activation: bool) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(n_in, n_out)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer, then ReLU (stage 1 only)."""
        y = self.linear(x)
        return torch.relu(y) if self.activation else y


STAGES = [(11, 6, 16, True), (12, 16, 3, False)]


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed data: the same in both runs."""
    gen = torch.Generator().manual_seed(7)
    return [(torch.randn(32, 6, generator=gen), torch.randn(32, 3, generator=gen)) for _ in range(steps)]


def train_pipeline(steps: int) -> list[torch.Tensor]:
    """Train the two remote stages; returns their final parameters."""
    stage1 = rpc.RemoteModule("worker1", Stage, args=STAGES[0])
    stage2 = rpc.RemoteModule("worker2", Stage, args=STAGES[1])
    params = stage1.remote_parameters() + stage2.remote_parameters()
    optimizer = rpc.DistributedOptimizer(torch.optim.Adam, params, lr=0.01)
    for x, y in batches(steps):
        with dist_autograd.context() as ctx_id:
            hidden = [stage1.forward_async(mb) for mb in x.chunk(MICRO_BATCHES)]
            out = torch.cat([stage2(h.wait()) for h in hidden])
            dist_autograd.backward(ctx_id, [nn.functional.mse_loss(out, y)])
            optimizer.step(ctx_id)
    return [p.to_here().detach() for p in params]


def train_single_process(steps: int) -> list[torch.Tensor]:
    """The same two stages, trained in one process."""
    model = nn.Sequential(Stage(*STAGES[0]), Stage(*STAGES[1]))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for x, y in batches(steps):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def main() -> None:
    """worker0 drives, worker1 and worker2 hold one stage each."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}")
    if rank == 0:
        distributed = train_pipeline(args.steps)
        reference = train_single_process(args.steps)
        initial = train_single_process(0)
        result = {
            "max_abs_diff": max(float((a - b).abs().max()) for a, b in zip(distributed, reference, strict=True)),
            "weights_moved_by": max(float((a - b).abs().max()) for a, b in zip(reference, initial, strict=True)),
            "owners": ["worker1", "worker1", "worker2", "worker2"],
        }
        print(json.dumps(result))
        if args.out is not None:
            (args.out / "pipeline.json").write_text(json.dumps(result))
    rpc.shutdown()


if __name__ == "__main__":
    main()
