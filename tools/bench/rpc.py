"""RPC round trips: rallypoint.rpc (grpc transport) against torch.distributed.rpc (TensorPipe), same run.

Two processes on this machine: this one calls, a child serves. Both join *both* RPC groups
(torch's TensorPipe agent on one port, rallypoint's on another), so the two sides are timed
alternately in the same processes against the same peer:

  small   rpc_sync(callee, echo, (4-element float32 tensor,))
  1mb     rpc_sync(callee, echo, (1 MiB float32 tensor,))
  remote  remote(callee, echo, (4-element tensor,)).to_here()

Two variants (--path), both sides on the same kind of link:

  tcp   A rallypoint over TCP on loopback (its same-host path off: same_host_shm = false)
        B TensorPipe restricted to its uv (TCP) transport and basic channel
  shm   A rallypoint as configured by default (it finds that the callee shares the host and
        uses its Unix socket)
        B TensorPipe restricted to its shm transport (cma and basic channels): it cannot fall
        back to TCP, so what is timed is its shared-memory path

Both sides use the safe defaults of their own: rallypoint the safe serializer with the job token
checked on every call; torch pickles (it has no other mode). Which link rallypoint used is checked
after the warm-up and printed. The function is echo, so a round trip carries the tensor both
ways; every result is compared with what was sent.

Each round runs --number calls of one side, then --number of the other (the order flips every
round), timing every call on its own; warm-up rounds come first and are discarded. Per side:
median, p90 and min of all calls; per case: the ratio of the medians (and of the p90s). The last
line is the headline: the largest median ratio among the cases run (below 1: rallypoint faster
in every case).

Run from the repository root:

    .venv/bin/python tools/bench/rpc.py                      # all cases, TCP
    .venv/bin/python tools/bench/rpc.py --path shm           # against TensorPipe's shm path
    .venv/bin/python tools/bench/rpc.py --cases small --rounds 40 --number 100
    .venv/bin/python tools/bench/rpc.py --smoke              # CI: 1 warm-up, 2 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import (
    SMOKE_ROUNDS,
    SMOKE_WARMUP,
    BenchmarkError,
    bench_parser,
    format_duration,
    format_ratio,
    schedule,
)

CASES = ("small", "1mb", "remote")
LABELS = ("rallypoint", "torch")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def echo(t: Any) -> Any:
    """The remote function of every case: return the argument."""
    return t


def _join(rank: int, torch_port: int, rp_port: int, path: str) -> tuple[Any, Any]:
    import warnings

    import torch.distributed.rpc as trpc

    warnings.filterwarnings("ignore", category=UserWarning, module="torch")  # its RPC's deprecation notes

    from rallypoint import rpc

    rpc.expose(echo)
    links = {"tcp": (["uv"], ["basic"]), "shm": (["shm"], ["cma", "basic"])}[path]
    opts = trpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{torch_port}", rpc_timeout=120, _transports=links[0], _channels=links[1]
    )
    trpc.init_rpc(f"torch{rank}", rank=rank, world_size=2, rpc_backend_options=opts)  # type: ignore[no-untyped-call]
    transport = {"same_host_shm": path == "shm"}
    rp_opts = rpc.RpcOptions(
        init_method=f"tcp://127.0.0.1:{rp_port}", rpc_timeout=120, host="127.0.0.1", transport_options=transport
    )
    rpc.init_rpc(f"rp{rank}", rank=rank, world_size=2, options=rp_opts)
    return trpc, rpc


def _callee(ports: str, path: str) -> int:
    torch_port, rp_port = (int(p) for p in ports.split(","))
    trpc, rpc = _join(1, torch_port, rp_port, path)
    trpc.shutdown()
    rpc.shutdown()
    return 0


def _sides(case: str, trpc: Any, rpc: Any) -> tuple[Callable[[], None], Callable[[], None], str]:
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


def _rallypoint_link() -> str:
    """How rallypoint reached the callee: ``unix socket``, ``tcp socket`` or ``grpc``."""
    from rallypoint.rpc import api

    agent = api.current_agent()
    transport: Any = agent.transport
    conn = transport._connections.get(agent.worker("rp1").address)
    if conn is None:
        return "grpc"
    return "unix socket" if conn.sock.family == socket.AF_UNIX else "tcp socket"


def _measure(sides: dict[str, Callable[[], None]], rounds: int, warmup: int, number: int) -> dict[str, list[float]]:
    """Per-call seconds of each side: blocks of ``number`` calls, alternating, order flipped each round."""
    times: dict[str, list[float]] = {"a": [], "b": []}
    clock = time.perf_counter_ns
    for i, pair in enumerate(schedule(warmup + rounds)):
        for key in pair:
            fn, out = sides[key], times[key]
            for _ in range(number):
                start = clock()
                fn()
                if i >= warmup:
                    out.append((clock() - start) / 1e9)
    return times


def _p90(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10, method="inclusive")[-1] if len(samples) > 1 else samples[0]


def _report(case: str, what: str, link: str, path: str, times: dict[str, list[float]], settings: str) -> float:
    a, b = times["a"], times["b"]
    lines = [
        f"rpc {case}",
        f"A rallypoint: {what} (safe serializer, token on every call; {link})",
        f"B torch:      {what} (TensorPipe {path})",
        settings,
        f"{'side':<10}  {'median':>11}  {'p90':>11}  {'min':>11}  {'calls':>6}",
        "-" * 57,
    ]
    for label, s in zip(LABELS, (a, b), strict=True):
        lines.append(
            f"{label:<10}  {format_duration(statistics.median(s)):>11}  {format_duration(_p90(s)):>11}  "
            f"{format_duration(min(s)):>11}  {len(s):>6}"
        )
    ratio = statistics.median(a) / statistics.median(b)
    lines.append(f"{case}: median ratio {format_ratio(ratio)}x, p90 ratio {format_ratio(_p90(a) / _p90(b))}x")
    print("\n".join(lines), flush=True)
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=20, warmup=2, number=50)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, among {', '.join(CASES)}")
    parser.add_argument("--path", "--tensorpipe", choices=("tcp", "shm"), default="tcp", help="the link both use")
    parser.add_argument("--role", choices=("caller", "callee"), default="caller", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases or any(c not in CASES for c in cases):
        parser.error(f"--cases: expected some of {', '.join(CASES)}, got {args.cases!r}")
    if args.role == "callee":
        return _callee(args.ports, args.path)
    rounds, warmup, number = (SMOKE_ROUNDS, SMOKE_WARMUP, 2) if args.smoke else (args.rounds, args.warmup, args.number)
    if rounds < 1 or warmup < 0 or number < 1:
        parser.error("--rounds and --number must be at least 1, --warmup at least 0")
    ports = f"{_free_port()},{_free_port()}"
    child = subprocess.Popen(
        [sys.executable, __file__, "--role", "callee", "--ports", ports, "--path", args.path],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    ratios: dict[str, float] = {}
    results: dict[str, Any] = {}
    try:
        torch_port, rp_port = (int(p) for p in ports.split(","))
        trpc, rpc = _join(0, torch_port, rp_port, args.path)
        settings = f"{rounds} rounds of {number} calls per side after {warmup} warm-up, alternating, order flipped"
        for case in cases:
            a, b, what = _sides(case, trpc, rpc)
            times = _measure({"a": a, "b": b}, rounds, warmup, number)
            link = _rallypoint_link()
            expected = "unix socket" if args.path == "shm" else "tcp socket"
            if link != expected:
                raise BenchmarkError(f"rallypoint used its {link} path, not the {expected} this variant times")
            ratios[case] = _report(case, what, link, args.path, times, settings)
            results[case] = {"link": link, "seconds": {label: times[k] for label, k in zip(LABELS, "ab", strict=True)}}
        trpc.shutdown()
        rpc.shutdown()
    finally:
        try:
            child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
    if args.json:
        Path(args.json).write_text(json.dumps({"path": args.path, "ratios": ratios, "cases": results}) + "\n")
    worst = max(ratios, key=lambda c: ratios[c])
    print(f"headline: the largest median ratio ({worst}), TensorPipe {args.path}")
    print(f"ratio {LABELS[0]}/{LABELS[1]}: {format_ratio(ratios[worst])}x")
    return 0 if child.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
