"""CLI start-up: `rallypoint --help` against `torchrun --help`, each as a whole command.

Both are run as fresh processes from this Python environment, alternately, and timed from
spawn to exit. This is the floor every `rallypoint` command pays: interpreter start, imports,
plugin discovery (entry points) and building the help text. torchrun imports torch to print
its help; rallypoint must not.

Run from the repository root:

    .venv/bin/python tools/bench/cli_startup.py            # 10 rounds after 1 warm-up
    .venv/bin/python tools/bench/cli_startup.py --smoke    # CI: 1 warm-up, 2 rounds
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import BenchmarkError, Command, bench_parser, find_executable, run_benchmark


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=10, warmup=1)
    args = parser.parse_args(argv)
    try:
        rallypoint = Command([find_executable("rallypoint"), "--help"])
        torchrun = Command([find_executable("torchrun"), "--help"])
        run_benchmark(
            args,
            rallypoint,
            torchrun,
            labels=("rallypoint", "torch"),
            title="cli_startup: whole command, spawn to exit",
            details=[f"A rallypoint: {rallypoint.describe()}", f"B torch:      {torchrun.describe()}"],
        )
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
