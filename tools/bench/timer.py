"""Timer costs (target P6): one recorded timeline event, and one watchdog acquire + release.

Two side-by-side measurements, each in this process with sides alternating per round:

1. Event: one ``start_event(name)`` + ``end_event(name)`` pair on a recorder that writes its
   JSON-lines log to a temporary file (background flush every second, as in a worker).
   Reference side: torch's ``record_function(name)`` entered and exited (no profiler running).
   Target: at most 2 us per event (absolute; the torch side is context only).
2. Watchdog (headline): ``acquire(scope, deadline)`` + ``release(scope)`` through the ``file``
   watchdog client, against torch's ``FileTimerClient``. Each client talks to its own server
   (rallypoint's ``file`` server / torch's ``FileTimerServer``), each running in a separate
   process, so only the worker-side cost is timed here. Each round is followed by an untimed
   pause so that both servers drain their pipes (torch's client fails when its pipe is full).
   Target: ratio <= 1.

Run from the repository root:

    .venv/bin/python tools/bench/timer.py                 # 10 rounds
    .venv/bin/python tools/bench/timer.py --smoke         # CI: 1 warm-up, 2 rounds, fewer calls

The last line is the watchdog ratio rallypoint/torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import (
    BenchmarkError,
    Comparison,
    Stats,
    bench_parser,
    compare,
    format_duration,
    format_report,
    settings_from_args,
)

EVENT_TARGET_S = 2e-6
#: Untimed pause after each watchdog round, so that both servers drain their FIFOs.
PAUSE_S = 0.25

RP_SERVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from rallypoint.timer.backends import FileWatchdog
    server = FileWatchdog.start_server(Path(sys.argv[1]), None)
    server.set_expiry_handler(lambda expiry: None)
    print(server.path, flush=True)
    sys.stdin.read()
    server.stop()
    """
)

TORCH_SERVER = textwrap.dedent(
    """
    import os, sys
    from torch.distributed.elastic.timer import FileTimerServer
    path = os.path.join(sys.argv[1], "torch.fifo")
    server = FileTimerServer(path, "bench", max_interval=0.1)
    server.start()
    print(path, flush=True)
    sys.stdin.read()
    server.stop()
    """
)


def start_server(code: str, directory: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, directory], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line:
        proc.kill()
        raise BenchmarkError(f"a watchdog server did not start ({code.split(chr(10))[3].strip()})")
    return proc, line


def stop_server(proc: subprocess.Popen[str]) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()


def paused_compare(
    a: Callable[[], None],
    b: Callable[[], None],
    *,
    rounds: int,
    warmup: int,
    number: int,
    pause: float,
    labels: tuple[str, str],
    progress: Callable[[int, str, float], None] | None,
) -> Comparison:
    """Like :func:`compare`, with a pause after each round (not timed) so the servers drain their pipes.

    torch's server reads its FIFO in bursts (it sleeps when no writer holds the pipe open) and
    torch's client raises ``BlockingIOError`` when the pipe is full, so back-to-back rounds would
    make the torch side fail rather than measure it.
    """
    samples: dict[str, list[float]] = {"a": [], "b": []}
    order: list[str] = []
    for i in range(warmup + rounds):
        a_first = i % 2 == 0
        c = compare(a if a_first else b, b if a_first else a, rounds=1, warmup=0, number=number)
        got = {"a": c.a.samples[0], "b": c.b.samples[0]} if a_first else {"a": c.b.samples[0], "b": c.a.samples[0]}
        if i >= warmup:
            for key in ("a", "b") if a_first else ("b", "a"):
                samples[key].append(got[key])
                order.append(key)
                if progress is not None:
                    progress(i - warmup, labels[0] if key == "a" else labels[1], got[key])
        time.sleep(pause)
    return Comparison(
        labels=labels,
        a=Stats(tuple(samples["a"])),
        b=Stats(tuple(samples["b"])),
        warmup=warmup,
        rounds=rounds,
        number=number,
        order=tuple(order),
    )


def amortized_event_cost(path: Path, events: int) -> float:
    """Seconds per event including the flusher's work (encode + write), flushing every 1000 events."""
    from rallypoint.timer.recorder import Recorder

    recorder = Recorder(path, rank=0, autoflush=False)
    start, end, flush = recorder.start, recorder.end, recorder.flush
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for i in range(events):
            start("step")
            end("step")
            if i % 1000 == 999:
                flush()
        flush()
        best = min(best, (time.perf_counter() - t0) / events)
    recorder.close()
    return best


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=10, warmup=1)
    parser.add_argument("--event-calls", type=int, default=20000, metavar="K", help="events per sample (default 20000)")
    parser.add_argument(
        "--watchdog-calls",
        type=int,
        default=100,
        metavar="K",
        help="acquire+release pairs per sample (default 100; torch's client fails on a full pipe)",
    )
    args = parser.parse_args(argv)
    if args.event_calls < 1 or args.watchdog_calls < 1:
        parser.error("--event-calls and --watchdog-calls must be >= 1")
    settings = settings_from_args(args)
    event_calls = 2000 if args.smoke else args.event_calls
    wd_calls = 50 if args.smoke else args.watchdog_calls
    progress = None
    if args.verbose:

        def progress(i: int, label: str, seconds: float) -> None:
            print(f"round {i}: {label} {format_duration(seconds)}", file=sys.stderr, flush=True)

    from torch.autograd.profiler import record_function
    from torch.distributed.elastic.timer.file_based_local_timer import FileTimerClient as TorchFileTimerClient

    from rallypoint.timer.backends import FileTimerClient
    from rallypoint.timer.recorder import Recorder

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rp-bench-timer-") as tmp:
        # 1. one recorded event
        recorder = Recorder(Path(tmp) / "rank_0.jsonl", rank=0)
        start, end = recorder.start, recorder.end

        def rp_event() -> None:
            start("step")
            end("step")

        def torch_event() -> None:
            with record_function("step"):
                pass

        c1 = compare(
            rp_event,
            torch_event,
            rounds=settings["rounds"],
            warmup=settings["warmup"],
            number=event_calls,
            labels=("rallypoint", "torch"),
            progress=progress,
        )
        recorder.close()
        amortized = amortized_event_cost(Path(tmp) / "amortized.jsonl", event_calls)
        print(
            format_report(
                c1,
                title="timer 1/2: one recorded event (start + end), in process",
                details=[
                    "A rallypoint: Recorder.start(name) + Recorder.end(name), JSON-lines log, flushed every 1 s",
                    "B torch:      with record_function(name): pass   (no profiler running; context only)",
                ],
            )
        )
        worst = max(c1.a.median, amortized)
        verdict = "met" if worst <= EVENT_TARGET_S else "MISSED"
        print(f"event cost with encoding and writing the log (flush every 1000 events): {format_duration(amortized)}")
        print(f"event cost {format_duration(worst)} per event (worse of the two); target <= 2 us: {verdict}")
        print()
        results["event"] = c1.as_dict()

        # 2. watchdog acquire + release
        rp_dir, torch_dir = Path(tmp) / "rp", Path(tmp) / "torch"
        rp_dir.mkdir()
        torch_dir.mkdir()
        rp_proc, rp_path = start_server(RP_SERVER, str(rp_dir))
        torch_proc, torch_path = start_server(TORCH_SERVER, str(torch_dir))
        try:
            rp_client = FileTimerClient(rp_path, rank=0)
            torch_client = TorchFileTimerClient(torch_path)
            deadline = time.time() + 3600

            def rp_watchdog() -> None:
                rp_client.acquire("bench", deadline)
                rp_client.release("bench")

            def torch_watchdog() -> None:
                torch_client.acquire("bench", deadline)
                torch_client.release("bench")

            # Both servers open their FIFO from a thread after start-up: connect once, untimed.
            time.sleep(PAUSE_S)
            rp_watchdog()
            torch_watchdog()
            time.sleep(PAUSE_S)
            c2 = paused_compare(
                rp_watchdog,
                torch_watchdog,
                rounds=settings["rounds"],
                warmup=settings["warmup"],
                number=wd_calls,
                pause=PAUSE_S,
                labels=("rallypoint", "torch"),
                progress=progress,
            )
            rp_client.close()
        finally:
            stop_server(rp_proc)
            stop_server(torch_proc)
        results["watchdog"] = c2.as_dict()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(
            format_report(
                c2,
                title="timer 2/2: watchdog acquire + release (worker side), file transport",
                details=[
                    "A rallypoint: rallypoint.timer.backends.FileTimerClient -> file server (own process)",
                    "B torch:      torch.distributed.elastic.timer.FileTimerClient -> FileTimerServer (own process)",
                ],
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
