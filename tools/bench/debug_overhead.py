"""What being debuggable costs a worker, and how long ``rallypoint debug stacks`` takes (issue #40).

Four measurements; each side-by-side pair alternates its sides round by round (tools/bench
harness), medians reported:

  1. the hook alone: the flight record's wrapper around a stand-in collective that returns at
     once, against the stand-in itself; synchronous, and ``async_op=True`` + ``wait()`` (the stand-in's
     work is complete: its wrapped ``wait()`` ends the record). The difference of the
     medians is the recorder's own cost per call (target <= 2 us); with --hooks-before FILE the
     ``async_op=True`` one also against that copy of the hooks, head to head;
  2. one process, a single-rank Gloo group (no peer to wait for): all_reduce(16 floats) recorded
     against plain, synchronous and ``async_op=True`` + ``wait()``; with --hooks-before FILE (a
     saved copy of debug_hooks.py, e.g. ``git show HEAD~1:<path> > before.py``) the synchronous
     one also for that copy in the same run, and the two recorders head to head;
  3. two processes, a 2-rank Gloo group (this script started twice with --pair-rank): the
     all_reduce(16 floats) loop recorded and plain; the same through the rallypoint facade
     (which issues torch's call asynchronously on Gloo, so its records complete through the
     callback); and a training step (a 256x256 matmul, then an all_reduce of its 16 first values)
     with the worker's debug hooks installed (faulthandler dump handler + flight record) or not
     (target ratio <= 1.01). Rank 0 prints; both ranks run the same schedule;
  4. answering ``debug stacks`` for --workers simulated workers (sleeping Python processes with
     the hooks installed) on one node: request written to a file rendezvous backend, every
     worker dumped, the answer gathered (median of --rounds, wall time); and the whole command,
     ``rallypoint debug stacks`` spawned until it has printed the report.

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

from tools.bench.debug_pair import WorkMethods, pair_main
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


def answer_time(workers: int, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds from the request to the gathered answer, and for the whole command, with ``workers`` sleepers.

    The first list: :func:`~rallypoint.agent.debug_service.request` to the answers gathered, in
    this process. The second: ``rallypoint debug stacks`` spawned until it exits, having printed
    the report (interpreter start, imports, request, answers, the report rendered).
    """
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
            whole = [_command_time(Path(tmp) / "rdzv", workers) for _ in range(rounds)]
            service.stop()
            return times, whole
        finally:
            for p in procs:
                p.kill()
                p.wait()


def _command_time(rdzv: Path, workers: int) -> float:
    """Seconds from spawning ``rallypoint debug stacks`` to its exit, the report printed."""
    argv = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()", "debug", "stacks"]
    argv += ["--rdzv-backend", "file", "--rdzv-endpoint", str(rdzv), "--run-id", "bench"]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - started
    if done.returncode != 0 or f"({workers} worker(s) on 1 node(s)" not in done.stdout:
        raise BenchmarkError(f"rallypoint debug stacks failed (exit {done.returncode}): {done.stdout}{done.stderr}")
    return took


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


class _DoneWork:
    """A completed work handle, what the stand-in collective returns (its class gets watched by the hooks)."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _BareWork(_DoneWork):
    """The same for the bare side: a class of its own, which the hooks never wrap."""


def hook_alone(args: argparse.Namespace, hooks: Any, tmp: str) -> None:
    """Measurement 1: the wrapper around a stand-in collective that returns at once."""
    import torch

    done, bare = _DoneWork(), _BareWork()

    def stand_in(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        return done if async_op else None

    def bare_in(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        return bare if async_op else None

    small = torch.ones(16)
    wrapped = hooks._wrap(hooks.FlightRecorder(os.path.join(tmp, "alone.flight")), "all_reduce", stand_in)
    c = run_benchmark(
        args,
        lambda: wrapped(small),
        lambda: bare_in(small),
        labels=("recorded", "bare"),
        title="debug overhead: the hook alone, around a stand-in all_reduce that returns at once (synchronous)",
    )
    print(f"flight record cost per call, hook alone (synchronous): {(c.a.median - c.b.median) * 1e6:.2f} us\n")
    c = run_benchmark(
        args,
        lambda: wrapped(small, async_op=True).wait(),
        lambda: bare_in(small, async_op=True).wait(),
        labels=("recorded", "bare"),
        title="debug overhead: the hook alone, stand-in all_reduce(async_op=True) + wait(), the work complete",
    )
    print(f"flight record cost per call, hook alone (async_op=True): {(c.a.median - c.b.median) * 1e6:.2f} us\n")
    if args.hooks_before is not None:
        _async_before(args, _hooks(args.hooks_before, "_bench_hooks_before_alone"), tmp, wrapped, small)


class _BeforeWork(_DoneWork):
    """The work of the earlier copy's stand-in: a class of its own, wrapped by that copy's hooks only."""


def _async_before(args: argparse.Namespace, before: Any, tmp: str, wrapped: Any, small: Any) -> None:
    """The hook alone, ``async_op=True`` + ``wait()``: this copy of the hooks against an earlier one, head to head."""
    done = _BeforeWork()

    def stand_in(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        return done if async_op else None

    old = before._wrap(before.FlightRecorder(os.path.join(tmp, "alone_before.flight")), "all_reduce", stand_in)
    c = run_benchmark(
        args,
        lambda: wrapped(small, async_op=True).wait(),
        lambda: old(small, async_op=True).wait(),
        labels=("after", "before"),
        title=f"debug overhead: the hook alone, async_op=True + wait(), this copy against {args.hooks_before}",
    )
    cost = (c.a.median - c.b.median) * 1e6
    print(f"flight record cost per call, hook alone (async_op=True), after - before: {cost:+.2f} us\n")


def single_rank(args: argparse.Namespace, hooks: Any, tmp: str) -> None:
    """Measurement 2: a single-rank Gloo all_reduce, recorded and plain, synchronous and async."""
    import torch
    import torch.distributed as dist

    small = torch.ones(16)
    plain = dist.all_reduce
    recorded = hooks._wrap(hooks.FlightRecorder(os.path.join(tmp, "rank_0.flight")), "all_reduce", plain)
    c = run_benchmark(
        args,
        lambda: recorded(small),
        lambda: plain(small),
        labels=("recorded", "plain"),
        title="debug overhead: flight record per collective (all_reduce of 16 floats, 1 rank, gloo)",
    )
    print(f"flight record cost per collective: {(c.a.median - c.b.median) * 1e6:.2f} us\n", flush=True)
    methods = WorkMethods(dist.Work)

    def waited(record: bool) -> None:
        methods.use(record)
        (recorded if record else plain)(small, async_op=True).wait()

    c = run_benchmark(
        args,
        lambda: waited(True),
        lambda: waited(False),
        labels=("recorded", "plain"),
        title="debug overhead: flight record per collective, async_op=True + wait() (16 floats, 1 rank, gloo)",
    )
    methods.use(False)
    print(f"flight record cost per collective, async_op=True: {(c.a.median - c.b.median) * 1e6:.2f} us\n")
    if args.hooks_before is not None:
        _compare_before(args, _hooks(args.hooks_before, "_bench_hooks_before"), tmp, recorded, plain, small)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=20, warmup=2, number=2000)
    parser.add_argument("--workers", type=int, default=64, help="simulated workers answering debug stacks")
    parser.add_argument(
        "--hooks-before", type=Path, metavar="FILE", help="also measure this copy of debug_hooks.py (before a change)"
    )
    parser.add_argument("--pair-rank", type=int, help=argparse.SUPPRESS)  # measurement 3's processes
    parser.add_argument("--pair-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pair_rank is not None:
        return pair_main(args, _hooks())
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    import torch.distributed as dist

    hooks = _hooks()
    dist.init_process_group("gloo")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            hook_alone(args, hooks, tmp)
            single_rank(args, hooks, tmp)
        except BenchmarkError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            dist.destroy_process_group()
    if run_pair(argv if argv is not None else sys.argv[1:]) != 0:
        return 1
    rounds = 2 if args.smoke else max(3, args.rounds // 4)
    try:
        times, whole = answer_time(args.workers, rounds)
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"debug stacks answer for {args.workers} simulated workers on one node: median "
        f"{statistics.median(times):.3f}s, max {max(times):.3f}s over {rounds} requests"
    )
    print(
        f"rallypoint debug stacks, command to printed report, {args.workers} simulated workers on one node: "
        f"median {statistics.median(whole):.3f}s, max {max(whole):.3f}s over {rounds} runs"
    )
    return 0


def run_pair(argv: list[str]) -> int:
    """Measurement 3: this script again as the two ranks of a Gloo group; rank 0 prints."""
    port = str(_free_port())
    kept: list[str] = []
    skip = False
    for a in argv:  # the children write no --json file (each measurement would overwrite it)
        if not skip and not a.startswith("--json"):
            kept.append(a)
        skip = a == "--json"
    argv = kept
    script = str(Path(__file__).resolve())
    sys.stdout.flush()
    procs = [
        subprocess.Popen(
            [sys.executable, script, *argv, "--pair-rank", str(r), "--pair-port", port],
            stdout=None if r == 0 else subprocess.DEVNULL,
        )
        for r in (0, 1)
    ]
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        print(f"error: the two-rank measurement failed (exit codes {codes})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
