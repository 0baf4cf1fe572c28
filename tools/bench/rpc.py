"""RPC round trips: rallypoint.rpc (grpc transport) against torch.distributed.rpc (TensorPipe), same run.

Each side runs in a pair of processes of its own, a caller and a callee (rallypoint's pair never
starts torch's RPC, torch's never starts rallypoint's: in one process the two change each
other's behaviour, see tools/bench/sides.py); the parent only conducts, asking one caller for a
batch of calls, then the other. The cases:

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
after each case and printed. The function is echo, so a round trip carries the tensor both
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
import socket
import statistics
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
    run_info,
    schedule,
)
from tools.bench.sides import SideProcesses, alone, free_port, join_group

CASES = ("small", "1mb", "remote")
LABELS = ("rallypoint", "torch")


def echo(t: Any) -> Any:
    """The remote function of every case: return the argument."""
    return t


def _call(case: str, api: Any) -> Callable[[], None]:
    """One call of ``case`` (checked) through ``api``."""
    import torch

    t = torch.arange(4, dtype=torch.float32) if case != "1mb" else torch.rand(1 << 18, dtype=torch.float32)

    def check(out: Any) -> None:
        if not torch.equal(out, t):
            raise BenchmarkError(f"{case}: the echoed tensor differs from the one sent")

    if case == "remote":
        return lambda: check(api.remote("w1", echo, args=(t,)).to_here())
    return lambda: check(api.rpc_sync("w1", echo, args=(t,)))


def _what(case: str) -> str:
    if case == "remote":
        return "remote(callee, echo, (t,)).to_here(), t = 4 float32"
    return f"rpc_sync(callee, echo, (t,)), t = {'4 float32' if case == 'small' else '1 MiB float32'}"


def _rallypoint_link() -> str:
    """How rallypoint reached the callee: ``unix socket``, ``tcp socket`` or ``grpc``."""
    from rallypoint.rpc import api

    agent = api.current_agent()
    transport: Any = agent.transport
    conn = transport._connections.get(agent.worker("w1").address)
    if conn is None:
        return "grpc"
    return "unix socket" if conn.sock.family == socket.AF_UNIX else "tcp socket"


def _caller(side: str, port: int, path: str) -> int:
    """Make calls when the parent asks (``run CASE K`` on stdin), answer each batch with one JSON line."""
    api = join_group(side, 0, port, path, echo)
    print("ready alone" if alone(side) else "ready, but the other side's RPC runs here too", flush=True)
    calls: dict[str, Callable[[], None]] = {}
    clock = time.perf_counter_ns
    for line in sys.stdin:
        words = line.split()
        if len(words) != 3 or words[0] != "run":
            break
        case, number = words[1], int(words[2])
        fn = calls.setdefault(case, _call(case, api))
        times = []
        for _ in range(number):
            start = clock()
            fn()
            times.append((clock() - start) / 1e9)
        link = _rallypoint_link() if side == "rallypoint" else f"TensorPipe {path}"
        print(json.dumps({"times": times, "link": link}), flush=True)
    api.shutdown()
    return 0


def _callee(side: str, port: int, path: str) -> int:
    join_group(side, 1, port, path, echo).shutdown()
    return 0


def _measure(
    sides: dict[str, SideProcesses], case: str, rounds: int, warmup: int, number: int
) -> tuple[dict[str, list[float]], str]:
    """Per-call seconds of each side (blocks of ``number`` calls, alternating, order flipped each round)
    and the link rallypoint used."""
    times: dict[str, list[float]] = {"a": [], "b": []}
    link = ""
    for i, pair in enumerate(schedule(warmup + rounds)):
        for key in pair:
            found = sides[key].ask(f"run {case} {number}", f"make {number} {case} calls")
            if i >= warmup:
                times[key] += found["times"]
            if key == "a":
                link = found["link"]
    return times, link


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
    parser.add_argument("--role", choices=("caller", "callee"), help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=LABELS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases or any(c not in CASES for c in cases):
        parser.error(f"--cases: expected some of {', '.join(CASES)}, got {args.cases!r}")
    if args.role is not None:
        return (_caller if args.role == "caller" else _callee)(args.side, args.port, args.path)
    rounds, warmup, number = (SMOKE_ROUNDS, SMOKE_WARMUP, 2) if args.smoke else (args.rounds, args.warmup, args.number)
    if rounds < 1 or warmup < 0 or number < 1:
        parser.error("--rounds and --number must be at least 1, --warmup at least 0")
    sides = {}
    for key, label in zip("ab", LABELS, strict=True):
        argv_ = [sys.executable, __file__, "--side", label, "--port", str(free_port()), "--path", args.path]
        sides[key] = SideProcesses(label, [*argv_, "--role", "caller"], [*argv_, "--role", "callee"], {})
    ratios: dict[str, float] = {}
    results: dict[str, Any] = {}
    clean = False
    try:
        for side in sides.values():
            said = side.read("start")
            if said != "ready alone":
                raise BenchmarkError(f"{side.label}'s caller did not start alone: {said!r}")
        settings = (
            f"{rounds} rounds of {number} calls per side after {warmup} warm-up, alternating, order flipped; "
            "each side in its own caller and callee processes"
        )
        expected = "unix socket" if args.path == "shm" else "tcp socket"
        for case in cases:
            times, link = _measure(sides, case, rounds, warmup, number)
            if link != expected:
                raise BenchmarkError(f"rallypoint used its {link} path, not the {expected} this variant times")
            ratios[case] = _report(case, _what(case), link, args.path, times, settings)
            results[case] = {"link": link, "seconds": {label: times[k] for label, k in zip(LABELS, "ab", strict=True)}}
    finally:
        clean = all([side.close() for side in sides.values()])
    if args.json:
        Path(args.json).write_text(
            json.dumps({"path": args.path, "ratios": ratios, "cases": results, "run": run_info()}) + "\n"
        )
    worst = max(ratios, key=lambda c: ratios[c])
    print(f"headline: the largest median ratio ({worst}), TensorPipe {args.path}")
    print(f"ratio {LABELS[0]}/{LABELS[1]}: {format_ratio(ratios[worst])}x")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
