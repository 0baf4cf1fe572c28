"""Collectives facade overhead per call: one process, a single-rank Gloo group.

With one rank there is no network and no peer to wait for, so a call costs only the Python and
C++ work on this process. That isolates what the facade adds (its timeout bookkeeping, the
async issue plus one bounded wait) from Gloo's run-to-run noise on two ranks, which is larger
than the overhead itself (see collectives.py).

  A rallypoint: rallypoint.collectives.all_reduce(t) / barrier()
  B torch:      torch.distributed.all_reduce(t) / barrier()

Run from the repository root:

    .venv/bin/python tools/bench/collectives_overhead.py           # 20 rounds, 2000 calls each
    .venv/bin/python tools/bench/collectives_overhead.py --smoke   # CI: 1 warm-up, 2 rounds
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import BenchmarkError, bench_parser, run_benchmark


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=20, warmup=2, number=2000)
    args = parser.parse_args(argv)
    os.environ.update(
        {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
            "RALLYPOINT_COLLECTIVES_BACKEND": "gloo",
        }
    )
    import torch
    import torch.distributed as dist

    import rallypoint.collectives as rc

    rc.init()
    small = torch.ones(16)
    try:
        for name, ours, theirs in (
            ("all_reduce of 16 floats", lambda: rc.all_reduce(small), lambda: dist.all_reduce(small)),
            ("barrier", rc.barrier, dist.barrier),
        ):
            run_benchmark(
                args,
                ours,
                theirs,
                labels=("rallypoint", "torch"),
                title=f"collectives overhead: {name}, 1 rank (gloo), per call",
                details=[
                    f"A rallypoint: rallypoint.collectives.{name.split()[0]}",
                    f"B torch:      torch.distributed.{name.split()[0]}",
                ],
            )
            print(flush=True)
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        rc.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
