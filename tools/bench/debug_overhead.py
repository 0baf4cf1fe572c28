"""What being debuggable costs a worker, and how long ``rallypoint debug stacks`` takes (issue #40).

Three measurements, in one process with a single-rank Gloo group (no peer to wait for, so the
figures are the Python and C++ work of this process):

  1. flight record per collective:
     A recorded: torch.distributed.all_reduce(16 floats) wrapped by the flight recorder
     B plain:    the same call, unwrapped
     the cost per collective is median A - median B (target <= 2 us); with --hooks-before FILE
     (a saved copy of debug_hooks.py, e.g. ``git show HEAD~1:<path> > before.py``) the same is
     measured for that copy in the same run, and the two recorders head to head;
  2. steady state: a training step (a 256x256 matmul, then an all_reduce of its 16 first values)
     with the worker's debug hooks installed (faulthandler dump handler + flight record) or not
     (target ratio <= 1.01);
  3. answering ``debug stacks`` for --workers simulated workers (sleeping Python processes with
     the hooks installed) on one node: request written to a file rendezvous backend, every
     worker dumped, the answer gathered (median of --rounds, wall time).

Run from the repository root:

    .venv/bin/python tools/bench/debug_overhead.py            # 20 rounds
    .venv/bin/python tools/bench/debug_overhead.py --smoke    # CI: 1 warm-up, 2 rounds
    .venv/bin/python tools/bench/debug_overhead.py --hooks-before /tmp/before.py   # a change's effect
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import BenchmarkError, bench_parser, run_benchmark

SLEEPER = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("hooks", sys.argv[1])
hooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hooks)
hooks.install(sys.argv[2], sys.argv[3])
print("ready", flush=True)
time.sleep(600)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _hooks(path: Path | None = None, name: str = "_bench_debug_hooks") -> Any:
    """The workers' hooks module (``path``: another copy of it), loaded by path as the worker loads it."""
    import importlib.util

    from rallypoint.agent import worker_main

    spec = importlib.util.spec_from_file_location(name, path or Path(worker_main.PATH).with_name("debug_hooks.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Group:
    """What :class:`DebugService` reads of a worker group: pids by rank, and which still run."""

    def __init__(self, pids: dict[int, int]) -> None:
        self.pids = pids

    def running(self) -> list[int]:
        return sorted(self.pids)


def answer_time(workers: int, rounds: int) -> list[float]:
    """Seconds from the request to the gathered answer, for ``workers`` hooked sleeping processes."""
    from rallypoint.agent.debug_service import DebugService, gather, request
    from rallypoint_file.backend import FileBackend

    hooks_path = str(Path(_hooks().__file__))
    with tempfile.TemporaryDirectory() as tmp:
        debug_dir = Path(tmp) / "log" / "attempt_0" / "debug"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", SLEEPER, hooks_path, str(debug_dir), str(r)], stdout=subprocess.PIPE, text=True
            )
            for r in range(workers)
        ]
        try:
            for p in procs:
                assert p.stdout is not None
                p.stdout.readline()
            backend = FileBackend(Path(tmp) / "rdzv", "bench")
            backend.set("hb/node0", {"seq": 0})
            service = DebugService(backend, "node0", "benchhost")
            service.follow(_Group({r: p.pid for r, p in enumerate(procs)}), {}, debug_dir)  # type: ignore[arg-type]
            service.start()
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                answers, missing = gather(backend, request(backend, "bench"), timeout=10)
                times.append(time.perf_counter() - started)
                dumped = sum(w["dumped"] for a in answers for w in a["workers"])
                if missing or dumped != workers:
                    raise BenchmarkError(f"{dumped} of {workers} workers answered; missing nodes {missing}")
            service.stop()
            return times
        finally:
            for p in procs:
                p.kill()
                p.wait()


def _compare_before(args: argparse.Namespace, before: Any, tmp: str, recorded: Any, plain: Any, small: Any) -> None:
    """The flight record's cost with an earlier copy of the hooks, and both recorders head to head."""
    old = before._wrap(before.FlightRecorder(os.path.join(tmp, "before.flight")), "all_reduce", plain)
    c = run_benchmark(
        args,
        lambda: old(small),
        lambda: plain(small),
        labels=("before", "plain"),
        title=f"debug overhead: flight record per collective with {args.hooks_before} (before)",
    )
    print(f"flight record cost per collective, before: {(c.a.median - c.b.median) * 1e6:.2f} us\n", flush=True)
    c = run_benchmark(
        args,
        lambda: recorded(small),
        lambda: old(small),
        labels=("after", "before"),
        title="debug overhead: flight record, this copy of the hooks against the one before, head to head",
    )
    print(f"flight record cost per collective, after - before: {(c.a.median - c.b.median) * 1e6:+.2f} us\n")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=20, warmup=2, number=2000)
    parser.add_argument("--workers", type=int, default=64, help="simulated workers answering debug stacks")
    parser.add_argument(
        "--hooks-before", type=Path, metavar="FILE", help="also measure this copy of debug_hooks.py (before a change)"
    )
    args = parser.parse_args(argv)
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    import torch
    import torch.distributed as dist

    hooks = _hooks()
    dist.init_process_group("gloo")
    small = torch.ones(16)
    plain = dist.all_reduce
    with tempfile.TemporaryDirectory() as tmp:
        recorder = hooks.FlightRecorder(os.path.join(tmp, "rank_0.flight"))
        recorded = hooks._wrap(recorder, "all_reduce", plain)
        try:
            c = run_benchmark(
                args,
                lambda: recorded(small),
                lambda: plain(small),
                labels=("recorded", "plain"),
                title="debug overhead: flight record per collective (all_reduce of 16 floats, 1 rank, gloo)",
            )
            print(f"flight record cost per collective: {(c.a.median - c.b.median) * 1e6:.2f} us\n", flush=True)
            if args.hooks_before is not None:
                _compare_before(args, _hooks(args.hooks_before, "_bench_hooks_before"), tmp, recorded, plain, small)

            a = torch.randn(256, 256)
            state = {"hooked": False}

            def step(hooked: bool) -> None:
                if hooked != state["hooked"]:  # install or remove the hooks between sides
                    if hooked:
                        hooks._stacks(tmp, "0")
                        dist.all_reduce = recorded
                    else:
                        import faulthandler

                        faulthandler.unregister(hooks.DUMP_SIGNAL)
                        dist.all_reduce = plain
                    state["hooked"] = hooked
                y = a @ a
                dist.all_reduce(y[0, :16])

            steps = argparse.Namespace(**{**vars(args), "number": max(1, args.number // 20)})  # a step is ~1 ms
            run_benchmark(
                steps,
                lambda: step(True),
                lambda: step(False),
                labels=("debuggable", "plain"),
                title="debug overhead: training step (256x256 matmul + all_reduce), hooks installed or not",
            )
            print(flush=True)
        except BenchmarkError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            dist.all_reduce = plain
            dist.destroy_process_group()
    rounds = 2 if args.smoke else max(3, args.rounds // 4)
    times = answer_time(args.workers, rounds)
    print(
        f"debug stacks answer for {args.workers} simulated workers on one node: median "
        f"{statistics.median(times):.3f}s, max {max(times):.3f}s over {rounds} requests"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
