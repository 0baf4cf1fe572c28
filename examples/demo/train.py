"""A small data-parallel training job: linear regression on synthetic data, Gloo all_reduce.

It is a plain torchrun-style script: it reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from
the environment (``init_method="env://"``), so it runs unmodified under ``torchrun`` and under
``rallypoint run``. Every rank trains on its own shard; gradients are averaged with all_reduce,
so all ranks end with identical weights, which the script checks before printing the result.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    """Train, check that every rank holds the same weights, print the result."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)  # same true weights everywhere
    true_w = torch.tensor([2.0, -3.0, 0.5])
    gen = torch.Generator().manual_seed(rank)  # a different data shard per rank
    x = torch.randn(256, 3, generator=gen)
    y = x @ true_w + 0.01 * torch.randn(256, generator=gen)

    w = torch.zeros(3, requires_grad=True)
    for step in range(args.steps):
        loss = torch.mean((x @ w - y) ** 2)
        loss.backward()
        assert w.grad is not None
        dist.all_reduce(w.grad, op=dist.ReduceOp.SUM)
        with torch.no_grad():
            w -= args.lr * w.grad / world
            w.grad.zero_()
        if step % 50 == 0 and rank == 0:
            print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)

    # every rank must hold the same weights: compare against rank 0's copy
    reference = w.detach().clone()
    dist.broadcast(reference, src=0)
    same = bool(torch.allclose(reference, w.detach()))
    print(
        f"rank {rank}/{world} (local {os.environ.get('LOCAL_RANK')}): "
        f"w = {[round(v, 3) for v in w.detach().tolist()]}, in sync with rank 0: {same}",
        flush=True,
    )
    dist.destroy_process_group()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
