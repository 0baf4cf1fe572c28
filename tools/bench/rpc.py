"""RPC round trips: rallypoint.rpc (grpc transport) against torch.distributed.rpc (TensorPipe), same run.

Two processes on this machine: this one calls, a child serves. Both join *both* RPC groups
(torch's TensorPipe agent on one port, rallypoint's on another), so the two sides are timed
alternately in the same processes against the same peer:

  small   rpc_sync(callee, echo, (4-element float32 tensor,))
  1mb     rpc_sync(callee, echo, (1 MiB float32 tensor,))
  remote  remote(callee, echo, (4-element tensor,)).to_here()

  A rallypoint: rallypoint.rpc, safe serializer, token checked on every call, TCP over loopback
  B torch:      torch.distributed.rpc, TensorPipe; --tensorpipe tcp (default) allows only its
                uv (TCP) transport and basic channel, --tensorpipe shm lets it pick its shared
                memory transport (its same-host path)

The function is echo, so a round trip carries the tensor both ways. Every result is checked
(equal to what was sent). One table per case; the last line is the ratio of the last case run.

Run from the repository root:

    .venv/bin/python tools/bench/rpc.py                        # all cases, TensorPipe TCP
    .venv/bin/python tools/bench/rpc.py --tensorpipe shm       # against TensorPipe's shm path
    .venv/bin/python tools/bench/rpc.py --cases small --rounds 20 --number 200
    .venv/bin/python tools/bench/rpc.py --smoke                # CI: 1 warm-up, 2 rounds
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import BenchmarkError, bench_parser, run_benchmark

CASES = ("small", "1mb", "remote")
_expose: Any = None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def echo(t: Any) -> Any:
    """The remote function of every case: return the argument."""
    return t


def _join(rank: int, torch_port: int, rp_port: int, tensorpipe: str) -> tuple[Any, Any]:
    import warnings

    import torch.distributed.rpc as trpc

    warnings.filterwarnings("ignore", category=UserWarning, module="torch")  # its RPC's deprecation notes

    from rallypoint import rpc

    rpc.expose(echo)
    opts = trpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{torch_port}", rpc_timeout=120)
    if tensorpipe == "tcp":
        opts = trpc.TensorPipeRpcBackendOptions(
            init_method=f"tcp://127.0.0.1:{torch_port}", rpc_timeout=120, _transports=["uv"], _channels=["basic"]
        )
    trpc.init_rpc(f"torch{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    rp_opts = rpc.RpcOptions(init_method=f"tcp://127.0.0.1:{rp_port}", rpc_timeout=120, host="127.0.0.1")
    rpc.init_rpc(f"rp{rank}", rank=rank, world_size=2, options=rp_opts)
    return trpc, rpc


def _callee(ports: str, tensorpipe: str) -> int:
    torch_port, rp_port = (int(p) for p in ports.split(","))
    trpc, rpc = _join(1, torch_port, rp_port, tensorpipe)
    trpc.shutdown()
    rpc.shutdown()
    return 0


def _sides(case: str, trpc: Any, rpc: Any) -> tuple[Any, Any, str]:
    import torch

    t = torch.arange(4, dtype=torch.float32) if case != "1mb" else torch.rand(1 << 18, dtype=torch.float32)

    def check(out: Any) -> None:
        if not torch.equal(out, t):
            raise BenchmarkError(f"{case}: the echoed tensor differs from the one sent")

    if case == "remote":
        return (
            lambda: check(rpc.remote("rp1", echo, args=(t,)).to_here()),
            lambda: check(trpc.remote("torch1", echo, args=(t,)).to_here()),
            "remote(callee, echo, (t,)).to_here(), t = 4 float32",
        )
    size = "4 float32" if case == "small" else "1 MiB float32"
    return (
        lambda: check(rpc.rpc_sync("rp1", echo, args=(t,))),
        lambda: check(trpc.rpc_sync("torch1", echo, args=(t,))),
        f"rpc_sync(callee, echo, (t,)), t = {size}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=10, warmup=1, number=50)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, among {', '.join(CASES)}")
    parser.add_argument("--tensorpipe", choices=("tcp", "shm"), default="tcp", help="TensorPipe's transports")
    parser.add_argument("--role", choices=("caller", "callee"), default="caller", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases or any(c not in CASES for c in cases):
        parser.error(f"--cases: expected some of {', '.join(CASES)}, got {args.cases!r}")
    if args.role == "callee":
        return _callee(args.ports, args.tensorpipe)
    ports = f"{_free_port()},{_free_port()}"
    child = subprocess.Popen(
        [sys.executable, __file__, "--role", "callee", "--ports", ports, "--tensorpipe", args.tensorpipe],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        trpc, rpc = _join(0, *(int(p) for p in ports.split(",")), args.tensorpipe)
        for case in cases:
            a, b, what = _sides(case, trpc, rpc)
            details = [
                f"A rallypoint: {what} (grpc, safe serializer)",
                f"B torch:      {what} (TensorPipe {args.tensorpipe})",
            ]
            run_benchmark(args, a, b, labels=("rallypoint", "torch"), title=f"rpc {case}", details=details)
        trpc.shutdown()
        rpc.shutdown()
    finally:
        try:
            child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
    return 0 if child.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
