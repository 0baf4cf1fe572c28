"""The training loop of the seeds on rallypoint RPC: the model lives on worker1, worker0 trains it.

worker0 creates the model on worker1 (``remote``), runs the forward pass through
``model.rpc_sync().forward(x)``, computes the loss and runs ``backward`` itself inside a
distributed autograd context, and the optimizer steps on worker1, the owner of the parameters
(``DistributedOptimizer``). worker0 then trains the same model in one process, with the same
seed and data, and compares the weights. Run with ``rallypoint run examples/rpc_autograd/train_remote.toml``.
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
from rallypoint.rpc.remote_module import parameter_rrefs

SEED = 0
LR = 0.05


@rpc.expose
def make_model(seed: int) -> nn.Module:
    """The model, built from a seed (on whichever worker calls it)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The training data (a fixed generator: the same in both runs)."""
    gen = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(steps):
        x = torch.randn(16, 4, generator=gen)
        out.append((x, x.sum(dim=1, keepdim=True).sin()))
    return out


def train_distributed(steps: int) -> list[torch.Tensor]:
    """The seeds' loop: forward through the RRef, backward here, optimizer step on the owner."""
    model = rpc.remote("worker1", make_model, args=(SEED,))
    params = rpc.rpc_sync("worker1", parameter_rrefs, args=(model,))
    optimizer = rpc.DistributedOptimizer(torch.optim.SGD, params, lr=LR, momentum=0.9)
    for x, y in batches(steps):
        with dist_autograd.context() as ctx_id:
            loss = nn.functional.mse_loss(model.rpc_sync().forward(x), y)
            dist_autograd.backward(ctx_id, [loss])
            optimizer.step(ctx_id)
    return [p.to_here().detach() for p in params]


def train_single_process(steps: int) -> list[torch.Tensor]:
    """The same training in one process."""
    model = make_model(SEED)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for x, y in batches(steps):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def main() -> None:
    """worker0 trains, worker1 owns the model; every worker joins and leaves together."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}")
    if rank == 0:
        distributed = train_distributed(args.steps)
        reference = train_single_process(args.steps)
        diff = max(float((a - b).abs().max()) for a, b in zip(distributed, reference, strict=True))
        moved = max(float((a - b).abs().max()) for a, b in zip(reference, train_single_process(0), strict=True))
        result = {"max_abs_diff": diff, "weights_moved_by": moved, "steps": args.steps}
        print(json.dumps(result))
        if args.out is not None:
            (args.out / "train_remote.json").write_text(json.dumps(result))
    rpc.shutdown()


if __name__ == "__main__":
    main()
