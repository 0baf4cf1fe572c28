"""Four RPC programs written against torch.distributed.rpc's names, run on torch or on rallypoint.

The only switch is the import block below (``RPC_IMPL=torch`` or ``RPC_IMPL=rallypoint``): the
programs use no rallypoint name, no ``@rpc.expose``; rallypoint runs them in its torch
compatibility mode (``RALLYPOINT_RPC_MODE=torch``, with the pickle serializer where a program
sends whole modules). Their shapes follow the usual public examples of torch's RPC:

* ``batch_ps``: a parameter server that answers each trainer once a batch of gradients arrived
  (``@rpc.functions.async_execution``), trainers getting the server's RRef as an argument;
* ``pipeline``: a driver and two remote shards held by RRefs, distributed autograd and
  ``DistributedOptimizer``;
* ``ddp_remote``: a ``RemoteModule`` (an embedding bag on a parameter server) passed to two
  trainers that wrap a local layer in DDP, distributed autograd, ``remote_parameters()``;
* ``rnn``: a local LSTM between a remote embedding table and a remote decoder, called through
  ``_remote_method``-style helpers.

``python programs.py PROGRAM`` starts the ranks itself (one process each, over 127.0.0.1) and
prints rank 0's result as one JSON line.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

if os.environ.get("RPC_IMPL") == "rallypoint":
    from rallypoint import rpc
    from rallypoint.rpc import DistributedOptimizer
    from rallypoint.rpc import autograd as dist_autograd
    from rallypoint.rpc.nn import RemoteModule
else:
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.distributed.nn import RemoteModule
    from torch.distributed.optim import DistributedOptimizer

STEPS = 6
LR = 0.05


# ---------------------------------------------------------------- helpers (torch examples' style)
def _call_method(method: Any, rref: Any, *args: Any, **kwargs: Any) -> Any:
    return method(rref.local_value(), *args, **kwargs)


def _remote_method(method: Any, rref: Any, *args: Any, **kwargs: Any) -> Any:
    return rpc.rpc_sync(rref.owner(), _call_method, args=[method, rref, *args], kwargs=kwargs)


def _parameter_rrefs(module: nn.Module) -> list[Any]:
    return [rpc.RRef(p) for p in module.parameters()]


def _data(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _init(module: nn.Module, seed: int) -> None:
    """Set the parameters from a private generator: modules built at once on one worker share no RNG."""
    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            p.copy_(0.3 * _data(seed + i, *p.shape))


def _flat(module: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).tolist()


# ---------------------------------------------------------------- batch parameter server
class BatchUpdateParameterServer:
    def __init__(self, batch_update_size: int) -> None:
        self.model = nn.Linear(8, 2)
        _init(self.model, 0)
        self.lock = threading.Lock()
        self.future_model: Any = torch.futures.Future()
        self.batch_update_size = batch_update_size
        self.curr_update_size = 0
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)

    def get_model(self) -> nn.Module:
        return self.model

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch_model(ps_rref: Any, grads: list[torch.Tensor]) -> Any:
        self = ps_rref.local_value()
        with self.lock:
            self.curr_update_size += 1
            for p, g in zip(self.model.parameters(), grads, strict=True):
                p.grad += g
            fut = self.future_model
            if self.curr_update_size >= self.batch_update_size:
                for p in self.model.parameters():
                    p.grad /= self.batch_update_size
                self.curr_update_size = 0
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                fut.set_result(self.model)
                self.future_model = torch.futures.Future()
        return fut


def run_trainer(ps_rref: Any, rank: int) -> list[float]:
    model = ps_rref.rpc_sync().get_model()
    losses = []
    for i in range(STEPS):
        x, y = _data(100 * rank + i, 16, 8), _data(1000 * rank + i, 16, 2)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.item())
        grads = [p.grad for p in model.parameters()]
        model = rpc.rpc_sync(ps_rref.owner(), BatchUpdateParameterServer.update_and_fetch_model, args=(ps_rref, grads))
    return losses


def batch_ps(rank: int, world: int) -> Any:
    if rank != 0:
        return None
    ps_rref = rpc.remote("ps", BatchUpdateParameterServer, args=(2,))
    futs = [rpc.rpc_async(f"trainer{r}", run_trainer, args=(ps_rref, r)) for r in (1, 2)]
    losses = [f.wait() for f in futs]
    return {"losses": losses, "params": _flat(ps_rref.rpc_sync().get_model())}


# ---------------------------------------------------------------- pipeline of two remote shards
class Shard1(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        _init(self, 10)

    def forward(self, x_rref: Any) -> torch.Tensor:
        x = x_rref.to_here()
        with self._lock:
            return self.seq(x)

    def parameter_rrefs(self) -> list[Any]:
        return _parameter_rrefs(self)


class Shard2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.fc = nn.Linear(16, 4)
        _init(self, 20)

    def forward(self, x_rref: Any) -> torch.Tensor:
        x = x_rref.to_here()
        with self._lock:
            return self.fc(x)

    def parameter_rrefs(self) -> list[Any]:
        return _parameter_rrefs(self)


class DistPipeline(nn.Module):
    def __init__(self, workers: list[str]) -> None:
        super().__init__()
        self.p1_rref = rpc.remote(workers[0], Shard1)
        self.p2_rref = rpc.remote(workers[1], Shard2)

    def forward(self, xs: torch.Tensor, split_size: int = 4) -> torch.Tensor:
        out_futures = []
        for x in iter(xs.split(split_size, dim=0)):
            x_rref = rpc.RRef(x)
            y_rref = self.p1_rref.remote().forward(x_rref)
            out_futures.append(self.p2_rref.rpc_async().forward(y_rref))
        return torch.cat(torch.futures.wait_all(out_futures))

    def parameter_rrefs(self) -> list[Any]:
        return self.p1_rref.remote().parameter_rrefs().to_here() + self.p2_rref.remote().parameter_rrefs().to_here()


def pipeline(rank: int, world: int) -> Any:
    if rank != 0:
        return None
    model = DistPipeline(["worker1", "worker2"])
    opt = DistributedOptimizer(torch.optim.SGD, model.parameter_rrefs(), lr=LR)
    losses = []
    for i in range(STEPS):
        x, y = _data(i, 12, 8), _data(50 + i, 12, 4)
        with dist_autograd.context() as context_id:
            loss = nn.functional.mse_loss(model(x), y)
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        losses.append(loss.item())
    return {"losses": losses}


# ---------------------------------------------------------------- RemoteModule + DDP
class HybridModel(nn.Module):
    def __init__(self, remote_emb_module: Any) -> None:
        super().__init__()
        self.remote_emb_module = remote_emb_module
        fc = nn.Linear(4, 2)
        _init(fc, 30)
        self.fc = nn.parallel.DistributedDataParallel(fc)

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.fc(self.remote_emb_module.forward(indices, offsets))


def _init_remote(module_rref: Any, seed: int) -> None:
    _init(module_rref.local_value(), seed)


def _run_ddp_trainer(remote_emb_module: Any, rank: int, port: int) -> dict[str, Any]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank - 1, world_size=2)
    try:
        model = HybridModel(remote_emb_module)
        params = remote_emb_module.remote_parameters() + [rpc.RRef(p) for p in model.fc.parameters()]
        opt = DistributedOptimizer(torch.optim.SGD, params, lr=LR)
        losses = []
        for i in range(STEPS):
            gen = torch.Generator().manual_seed(10 * rank + i)
            indices = torch.randint(0, 20, (12,), generator=gen)
            offsets = torch.tensor([0, 3, 6, 9])
            target = torch.randint(0, 2, (4,), generator=gen)
            with dist_autograd.context() as context_id:
                loss = nn.functional.cross_entropy(model(indices, offsets), target)
                dist_autograd.backward(context_id, [loss])
                opt.step(context_id)
            losses.append(loss.item())
            dist.barrier()  # the remote table's two updates land before either trainer reads it again
        return {"losses": losses, "fc": _flat(model.fc.module)}
    finally:
        dist.destroy_process_group()


def ddp_remote(rank: int, world: int) -> Any:
    if rank != 0:
        return None
    emb = RemoteModule("ps/cpu", nn.EmbeddingBag, args=(20, 4), kwargs={"mode": "sum"})
    rpc.rpc_sync("ps", _init_remote, args=(emb.get_module_rref(), 40))
    port = int(os.environ["PROGRAM_PORT2"])
    futs = [rpc.rpc_async(f"trainer{r}", _run_ddp_trainer, args=(emb, r, port)) for r in (1, 2)]
    results = [f.wait() for f in futs]
    table = torch.cat([p.to_here().reshape(-1) for p in emb.remote_parameters()]).tolist()
    return {"trainers": results, "table": table}


# ---------------------------------------------------------------- RNN with remote embedding table
class EmbeddingTable(nn.Module):
    def __init__(self, ntoken: int, ninp: int) -> None:
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        _init(self, 50)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.encoder(inp)


class Decoder(nn.Module):
    def __init__(self, ntoken: int, nhid: int) -> None:
        super().__init__()
        self.decoder = nn.Linear(nhid, ntoken)
        _init(self, 60)

    def forward(self, output: torch.Tensor) -> torch.Tensor:
        return self.decoder(output)


class RNNModel(nn.Module):
    def __init__(self, ps: str, ntoken: int = 30, ninp: int = 8, nhid: int = 8) -> None:
        super().__init__()
        self.emb_table_rref = rpc.remote(ps, EmbeddingTable, args=(ntoken, ninp))
        self.rnn = nn.LSTM(ninp, nhid, 1)
        _init(self.rnn, 70)
        self.decoder_rref = rpc.remote(ps, Decoder, args=(ntoken, nhid))

    def forward(self, inp: torch.Tensor, hidden: Any) -> Any:
        emb = _remote_method(EmbeddingTable.forward, self.emb_table_rref, inp)
        output, hidden = self.rnn(emb, hidden)
        return _remote_method(Decoder.forward, self.decoder_rref, output), hidden

    def parameter_rrefs(self) -> list[Any]:
        remote_params = _remote_method(_parameter_rrefs, self.emb_table_rref)
        remote_params.extend(_parameter_rrefs(self.rnn))
        remote_params.extend(_remote_method(_parameter_rrefs, self.decoder_rref))
        return remote_params


def rnn(rank: int, world: int) -> Any:
    if rank != 0:
        return None
    model = RNNModel("ps")
    opt = DistributedOptimizer(torch.optim.SGD, model.parameter_rrefs(), lr=LR)
    losses = []
    for i in range(STEPS):
        gen = torch.Generator().manual_seed(i)
        inp = torch.randint(0, 30, (5, 3), generator=gen)
        target = torch.randint(0, 30, (5, 3), generator=gen)
        hidden = (torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))
        with dist_autograd.context() as context_id:
            output, hidden = model(inp, hidden)
            loss = nn.functional.cross_entropy(output.reshape(-1, 30), target.reshape(-1))
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        losses.append(loss.item())
    return {"losses": losses}


# ---------------------------------------------------------------- ranks
PROGRAMS = {
    "batch_ps": (batch_ps, ["master", "ps", "trainer1", "trainer2"], [0, 1, 2, 3]),
    "pipeline": (pipeline, ["master", "worker1", "worker2"], [0, 1, 2]),
    "ddp_remote": (ddp_remote, ["master", "trainer1", "trainer2", "ps"], [0, 1, 2, 3]),
    "rnn": (rnn, ["trainer", "ps"], [0, 1]),
}


def _rank_main(program: str, rank: int) -> None:
    fn, names, _ = PROGRAMS[program]
    world = len(names)
    rpc.init_rpc(names[rank], rank=rank, world_size=world)
    result = fn(rank, world)
    rpc.shutdown()
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(program: str, impl: str, timeout: float = 120) -> Any:
    """Run ``program`` on ``impl`` (``"torch"`` or ``"rallypoint"``), one process per rank; rank 0's result."""
    names = PROGRAMS[program][1]
    env = dict(os.environ, RPC_IMPL=impl, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    env["PROGRAM_PORT2"] = str(_free_port())
    if impl == "rallypoint":
        env.update(RALLYPOINT_RPC_MODE="torch", RALLYPOINT_RPC_SERIALIZER="pickle")
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), program, "--rank", str(rank)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(len(names))
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs, strict=True)):
        if proc.returncode != 0:
            raise RuntimeError(f"{program} on {impl}: rank {rank} exited {proc.returncode}:\n{out}\n{err[-4000:]}")
    for line in outputs[0][0].splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{program} on {impl}: rank 0 printed no result:\n{outputs[0][0]}\n{outputs[0][1][-4000:]}")


if __name__ == "__main__":
    if "--rank" in sys.argv:
        _rank_main(sys.argv[1], int(sys.argv[sys.argv.index("--rank") + 1]))
    else:
        print(json.dumps(launch(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "torch")))
