"""A parameter server with two trainers, on distributed autograd and ``DistributedOptimizer``.

worker0 holds the model (a linear layer) and starts two trainers, worker1 and worker2. Each
trainer, at every step and concurrently with the other, runs the forward pass on the server
(``model.rpc_sync().forward(x)``), computes its loss, runs ``backward`` in its own distributed
autograd context and steps the server's parameters with that context's gradients only
(``DistributedOptimizer``). Each trainer checks, at every step, that the gradient the server
holds for its context is exactly the one its own data gives, which proves that the two
trainers' gradients never mixed. Run with ``rallypoint run examples/rpc_autograd/param_server.toml``.
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

TRUE_W = torch.tensor([[2.0, -3.0, 0.5]])
TRUE_B = 0.25


@rpc.expose
def context_gradients(ctx_id: int, params: list[rpc.RRef[torch.Tensor]]) -> list[torch.Tensor]:
    """Run on the server: the gradients that context ``ctx_id`` left for ``params``."""
    grads = dist_autograd.get_gradients(ctx_id)
    return [grads[p.local_value()] for p in params]


@rpc.expose
def train(model: rpc.RRef[nn.Linear], trainer: int, steps: int) -> dict[str, float]:
    """A trainer's loop; returns its last loss and the largest gradient mismatch it saw."""
    params = rpc.rpc_sync(model.owner(), parameter_rrefs, args=(model,))
    optimizer = rpc.DistributedOptimizer(torch.optim.SGD, params, lr=0.1)
    gen = torch.Generator().manual_seed(100 + trainer)
    worst, loss = 0.0, torch.tensor(0.0)
    for _ in range(steps):
        x = torch.randn(32, 3, generator=gen)
        y = x @ TRUE_W.T + TRUE_B
        with dist_autograd.context() as ctx_id:
            out = model.rpc_sync().forward(x)
            loss = nn.functional.mse_loss(out, y)
            dist_autograd.backward(ctx_id, [loss])
            held = rpc.rpc_sync(model.owner(), context_gradients, args=(ctx_id, params))
            d_out = 2 * (out.detach() - y) / y.numel()  # what this trainer's data alone gives
            expected = [d_out.T @ x, d_out.sum(dim=0)]
            worst = max(worst, *(float((h - e).abs().max()) for h, e in zip(held, expected, strict=True)))
            optimizer.step(ctx_id)
    return {"last_loss": float(loss.detach()), "gradient_mismatch": worst}


def main() -> None:
    """worker0 serves the model; worker1 and worker2 train it at the same time."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"worker{rank}")
    if rank == 0:
        torch.manual_seed(0)
        layer = nn.Linear(3, 1)
        model = rpc.RRef(layer)
        futures = [rpc.rpc_async(f"worker{t}", train, args=(model, t, args.steps)) for t in range(1, world)]
        trainers = [fut.wait() for fut in futures]
        result = {
            "trainers": trainers,
            "weight": layer.weight.detach().tolist(),
            "bias": layer.bias.detach().tolist(),
            "true_weight": TRUE_W.tolist(),
            "true_bias": TRUE_B,
            "grad_left_in_dot_grad": layer.weight.grad is not None or layer.bias.grad is not None,
        }
        print(json.dumps(result))
        if args.out is not None:
            (args.out / "param_server.json").write_text(json.dumps(result))
    rpc.shutdown()


if __name__ == "__main__":
    main()
