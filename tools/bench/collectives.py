"""Collectives (P4): the rallypoint facade against raw torch.distributed on the same process group.

Starts 2 worker processes (this script with --worker) on loopback with torchrun's variables; each
initialises the process group once with rallypoint.collectives.init() and then, in lockstep,
times both sides alternately on that same group:

  A rallypoint: rallypoint.collectives.all_reduce(t) / barrier()   (job default timeout active)
  B torch:      torch.distributed.all_reduce(t) / barrier()

for Gloo all_reduce of 1 MB and 64 MB (float32) and barrier. Rank 0 prints one table per case,
a summary, and last the headline: the worst (largest) of the three ratios. Target: <= 1.03x.

Run from the repository root:

    .venv/bin/python tools/bench/collectives.py                  # 40 rounds after 2 warm-ups
    .venv/bin/python tools/bench/collectives.py --smoke          # CI: 1 warm-up, 2 rounds
    .venv/bin/python tools/bench/collectives.py --backend nccl   # on a GPU machine (CUDA tensors)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import (
    BenchmarkError,
    Comparison,
    bench_parser,
    compare,
    format_ratio,
    format_report,
    settings_from_args,
)

#: (case name, payload bytes or None for barrier, calls per sample)
CASES: tuple[tuple[str, int | None, int], ...] = (
    ("all_reduce 1MB", 1 << 20, 10),
    ("all_reduce 64MB", 64 << 20, 1),
    ("barrier", None, 50),
)


def _parser() -> argparse.ArgumentParser:
    parser = bench_parser(__doc__, rounds=40, warmup=2)
    parser.add_argument(
        "--nprocs", type=int, default=2, help="worker processes (default 2; 1 is allowed for a single GPU)"
    )
    parser.add_argument("--backend", default="gloo", help="collective backend: gloo (default), nccl or auto")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(argv: list[str], args: argparse.Namespace) -> int:
    if args.nprocs < 1:
        raise BenchmarkError("--nprocs must be at least 1")
    port = _free_port()
    procs = []
    for rank in range(args.nprocs):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(args.nprocs),
            LOCAL_WORLD_SIZE=str(args.nprocs),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RALLYPOINT_COLLECTIVES_BACKEND=args.backend,
        )
        env.setdefault("OMP_NUM_THREADS", "1")
        procs.append(
            subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker", *argv],
                env=env,
                stdout=subprocess.PIPE if rank else None,
                stderr=None if rank == 0 else subprocess.PIPE,
                text=True,
            )
        )
    codes = []
    for proc in procs:
        _out, err = proc.communicate(timeout=900)
        codes.append(proc.returncode)
        if proc.returncode and err:
            print(err[-2000:], file=sys.stderr)
    if any(codes):
        print(f"error: worker exit codes {codes}", file=sys.stderr)
        return 1
    return 0


def _worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    import rallypoint.collectives as rc

    info = rc.init()
    device = torch.device("cuda", torch.cuda.current_device()) if info.device == "cuda" else torch.device("cpu")
    rank = rc.get_rank()
    settings = settings_from_args(args)
    results: list[tuple[str, Comparison]] = []
    for name, size, number in CASES:
        if size is None:

            def side_a() -> None:
                rc.barrier()

            def side_b() -> None:
                dist.barrier()

        else:
            tensor = torch.ones(size // 4, dtype=torch.float32, device=device)

            def side_a(tensor: torch.Tensor = tensor) -> None:
                rc.all_reduce(tensor)

            def side_b(tensor: torch.Tensor = tensor) -> None:
                dist.all_reduce(tensor)

        calls = settings["number"] if settings["number"] > 1 else number
        rc.barrier()
        comparison = compare(
            side_a,
            side_b,
            rounds=settings["rounds"],
            warmup=settings["warmup"],
            number=calls,
            labels=("rallypoint", "torch"),
        )
        if info.device == "cuda":
            torch.cuda.synchronize()
        results.append((name, comparison))
    rc.barrier()
    if rank == 0:
        _print(results, info, args)
    sys.stdout.flush()
    os._exit(0)  # skip process-group teardown at exit: not what is measured


def _print(results: list[tuple[str, Comparison]], info: Any, args: argparse.Namespace) -> None:
    for name, comparison in results:
        print(
            format_report(
                comparison,
                title=f"collectives: {info.backend} {name}, {args.nprocs} ranks, same process group",
                details=[
                    "A rallypoint: rallypoint.collectives." + ("barrier()" if name == "barrier" else "all_reduce(t)"),
                    "B torch:      torch.distributed." + ("barrier()" if name == "barrier" else "all_reduce(t)"),
                ],
            )
        )
        print()
    print("summary (median per call)")
    for name, c in results:
        print(
            f"  {name:<16} rallypoint {c.a.median * 1e6:10.1f} us   torch {c.b.median * 1e6:10.1f} us   "
            f"ratio {format_ratio(c.ratio)}x"
        )
    worst_name, worst = max(results, key=lambda item: item[1].ratio)
    if args.json:
        Path(args.json).write_text(
            json.dumps({name: c.as_dict() for name, c in results} | {"headline": worst.ratio}, indent=2)
        )
    print(f"headline: the worst of the {len(results)} cases ({worst_name}); target <= 1.03x")
    print(f"ratio rallypoint/torch: {format_ratio(worst.ratio)}x")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        if args.worker:
            return _worker(args)
        return _launch([a for a in argv if a != "--worker"], args)
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
