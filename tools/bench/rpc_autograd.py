"""Distributed autograd through one remote linear layer: rallypoint.rpc against torch.distributed.autograd.

Each side runs in a pair of processes of its own: a caller that trains and a callee that owns the
layer; the rallypoint pair never starts torch's RPC, the torch pair never starts rallypoint's.
The parent only conducts: it asks one caller for --number steps, then the other (the order flips
every round), so both sides meet the same machine, and neither runs in a process whose threads
the other side has changed. (Earlier versions ran both RPC systems in the same two processes;
torch's RPC threads there shortened the spin-waits of the processes' idle OpenMP threads, which
favoured rallypoint's side: see docs/rpc.md.) Each side's layer is ``torch.nn.Linear(1024, 1024)``
built on its callee from the same seed, and one step is

  with context() as ctx:                       # rallypoint.rpc.autograd / torch.distributed.autograd
      out = layer_rref.rpc_sync().forward(x)   # x: 256 x 1024 float32 (1 MiB), requires grad
      backward(ctx, [out.sum()])               # 1 MiB of gradient back to the child, 1 MiB to x

so 1 MiB of activations travels each way in the forward pass and again in the backward pass.
Two figures per side: ``backward`` (the ``backward`` call alone: the gradient message to the
owner, its local backward, the gradient of ``x`` back) and ``step`` (context, forward and
backward); and, to see who uses the CPU meanwhile, the caller's CPU time during ``backward`` (all
its threads: a caller that only waits uses little). Every step's gradient of ``x`` is checked
against the analytic one.

Both sides use their own defaults: rallypoint the safe serializer with the job token checked on
every call, TCP on loopback (its same-host path off, --path tcp) or its default same-host path
(--path shm); torch TensorPipe restricted to uv (TCP) or to shm, as tools/bench/rpc.py does.

--threads sets OMP_NUM_THREADS in all four processes: 1 by default, what ``rallypoint run`` (and
torchrun) give workers that share a node, so the two processes of a side each have a core of this
2-CPU machine, as on two hosts. ``--threads 0`` leaves torch's default (one per CPU: the caller's
and the callee's threads then share the cores).

Each round runs --number steps of one side, then --number of the other; warm-up rounds are
discarded. Per figure: median, p90, min and the ratio of the medians. The last line is the
headline: the larger of the two median ratios. The default is 30 rounds of 10 steps (300 steps
per side).

--layer prelu puts an ``nn.PReLU(1024)`` on the callee instead: elementwise, so the same 1 MiB
travels each way in both passes but there is almost nothing to compute, and the step is the
messaging and the Python around it.

Run from the repository root:

    .venv/bin/python tools/bench/rpc_autograd.py
    .venv/bin/python tools/bench/rpc_autograd.py --path shm --threads 0
    .venv/bin/python tools/bench/rpc_autograd.py --layer prelu
    .venv/bin/python tools/bench/rpc_autograd.py --smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
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
)
from tools.bench.harness import schedule as alternate
from tools.bench.sides import SideProcesses, alone, free_port, join_group

LABELS = ("rallypoint", "torch")
FIGURES = ("backward", "step")
BATCH, WIDTH = 256, 1024  # 256 x 1024 float32 = 1 MiB of activations
TOLERANCE = 1e-4  # of every element of the gradient of x


LAYERS = ("linear", "prelu")
_NAMES = {"linear": "nn.Linear(1024, 1024)", "prelu": "nn.PReLU(1024)"}


def make_layer(kind: str = "linear") -> Any:
    """The remote layer, the same weights on both sides (from a generator of its own, not the global one).

    ``linear``: ``nn.Linear(1024, 1024)`` (the backward is two matrix products: ~10-15 ms on one
    core). ``prelu``: ``nn.PReLU(1024)`` (elementwise: the same 1 MiB each way, almost no compute,
    so the step is the messaging).
    """
    import torch

    gen = torch.Generator().manual_seed(0)
    if kind == "prelu":
        prelu = torch.nn.PReLU(WIDTH)
        with torch.no_grad():
            prelu.weight.copy_(torch.rand(WIDTH, generator=gen))
        return prelu
    bound = WIDTH**-0.5
    layer = torch.nn.Linear(WIDTH, WIDTH)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(WIDTH, WIDTH, generator=gen) * 2 * bound - bound)
        layer.bias.copy_(torch.rand(WIDTH, generator=gen) * 2 * bound - bound)
    return layer


def expected_gradient(kind: str, x: Any) -> Any:
    """d sum(layer(x)) / dx."""
    import torch

    weight = make_layer(kind).weight.detach()
    if kind == "prelu":
        return torch.where(x > 0, torch.ones(()), weight.expand_as(x))
    return torch.ones(BATCH, WIDTH) @ weight  # d sum(x W^T + b) / dx


# ------------------------------------------------------------------------------------------------
# The four processes: a caller and a callee per side, each side's RPC only


def _caller(side: str, port: int, path: str, kind: str) -> int:
    """Run steps when the parent asks (``run K`` on stdin), answer each batch with one JSON line."""
    import torch

    api = join_group(side, 0, port, path, make_layer)
    if side == "torch":
        import torch.distributed.autograd as autograd
    else:
        from rallypoint.rpc import autograd  # type: ignore[no-redef]
    x = torch.rand(BATCH, WIDTH, requires_grad=True)
    layer = api.remote("w1", make_layer, args=(kind,))
    expected = expected_gradient(kind, x.detach())
    clock = time.perf_counter
    print("ready alone" if alone(side) else "ready, but the other side's RPC runs here too", flush=True)
    for line in sys.stdin:
        if not line.startswith("run "):
            break
        times: dict[str, list[float]] = {f: [] for f in (*FIGURES, "caller_cpu")}
        worst = 0.0
        for _ in range(int(line.split()[1])):
            start = clock()
            with autograd.context() as ctx:
                out = layer.rpc_sync().forward(x)
                mid, cpu = clock(), time.process_time()
                autograd.backward(ctx, [out.sum()])
                end = clock()
                times["caller_cpu"].append(time.process_time() - cpu)  # every thread of the caller
                grad = autograd.get_gradients(ctx)[x]
            times["backward"].append(end - mid)
            times["step"].append(end - start)
            worst = max(worst, float((grad - expected).abs().max()))  # every step, outside the timed part
        print(json.dumps({"times": times, "error": worst}), flush=True)
    del layer
    api.shutdown()
    return 0


def _callee(side: str, port: int, path: str, kind: str) -> int:
    del kind  # the caller asks for the layer
    api = join_group(side, 1, port, path, make_layer)
    api.shutdown()
    return 0


def _side(label: str, path: str, threads: int, kind: str) -> SideProcesses:
    """``label``'s caller and callee processes (started)."""
    argv = [sys.executable, __file__, "--side", label, "--port", str(free_port()), "--path", path, "--layer", kind]
    env = {"OMP_NUM_THREADS": str(threads)} if threads else {}
    return SideProcesses(label, [*argv, "--role", "caller"], [*argv, "--role", "callee"], env)


def _run(side: SideProcesses, steps: int) -> dict[str, Any]:
    found: dict[str, Any] = side.ask(f"run {steps}", f"run {steps} steps")
    if found["error"] > TOLERANCE:
        raise BenchmarkError(f"{side.label}'s gradient of x is off by up to {found['error']:g}")
    return found


def _measure(sides: dict[str, SideProcesses], rounds: int, warmup: int, number: int) -> Any:
    times: dict[str, dict[str, list[float]]] = {k: {f: [] for f in (*FIGURES, "caller_cpu")} for k in "ab"}
    for i, pair in enumerate(alternate(warmup + rounds)):
        for key in pair:
            found = _run(sides[key], number)
            if i >= warmup:
                for figure in times[key]:
                    times[key][figure] += found["times"][figure]
    return times


def _p90(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10, method="inclusive")[-1] if len(samples) > 1 else samples[0]


def _report(times: Any, path: str, kind: str, settings: str) -> dict[str, float]:
    lines = [
        f"rpc_autograd: forward and backward through one remote {_NAMES[kind]}, x = 256 x 1024 float32",
        "A rallypoint: rallypoint.rpc.autograd, grpc transport (safe serializer, token on every call, "
        f"same-host path {'on' if path == 'shm' else 'off'})",
        f"B torch:      torch.distributed.autograd over TensorPipe {path}",
        settings,
        f"{'figure':<9} {'side':<10}  {'median':>11}  {'p90':>11}  {'min':>11}  {'steps':>6}",
        "-" * 66,
    ]
    ratios = {}
    for figure in FIGURES:
        for label, key in zip(LABELS, "ab", strict=True):
            s = times[key][figure]
            lines.append(
                f"{figure:<9} {label:<10}  {format_duration(statistics.median(s)):>11}  "
                f"{format_duration(_p90(s)):>11}  {format_duration(min(s)):>11}  {len(s):>6}"
            )
        a, b = times["a"][figure], times["b"][figure]
        ratios[figure] = statistics.median(a) / statistics.median(b)
        lines.append(
            f"{figure}: median ratio {format_ratio(ratios[figure])}x, p90 ratio {format_ratio(_p90(a) / _p90(b))}x"
        )
    cpu = [format_duration(statistics.median(times[key]["caller_cpu"])) for key in "ab"]
    lines.append(
        f"caller CPU time during backward (all its threads, median): {LABELS[0]} {cpu[0]}, {LABELS[1]} {cpu[1]}"
    )
    print("\n".join(lines), flush=True)
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=30, warmup=2, number=10)
    parser.add_argument("--path", choices=("tcp", "shm"), default="tcp", help="the link both sides use")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="OMP_NUM_THREADS of the four processes (default 1, as rallypoint run gives workers sharing "
        "a node; 0: torch's default, one per CPU)",
    )
    parser.add_argument(
        "--layer",
        choices=LAYERS,
        default="linear",
        help="the remote layer: linear (default, the issue's benchmark) or prelu (elementwise, the same "
        "1 MiB each way and almost no compute: the messaging alone)",
    )
    parser.add_argument("--role", choices=("caller", "callee"), help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=LABELS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role is not None:
        return (_caller if args.role == "caller" else _callee)(args.side, args.port, args.path, args.layer)
    rounds, warmup, number = (SMOKE_ROUNDS, SMOKE_WARMUP, 2) if args.smoke else (args.rounds, args.warmup, args.number)
    if rounds < 1 or warmup < 0 or number < 1 or args.threads < 0:
        parser.error("--rounds and --number must be at least 1, --warmup and --threads at least 0")
    sides = {key: _side(label, args.path, args.threads, args.layer) for key, label in zip("ab", LABELS, strict=True)}
    clean = False
    try:
        for side in sides.values():
            said = side.read("start")
            if said != "ready alone":
                raise BenchmarkError(f"{side.label}'s caller did not start alone: {said!r}")
        threads = f"OMP_NUM_THREADS={args.threads}" if args.threads else "torch's default threads (one per CPU)"
        settings = (
            f"{rounds} rounds of {number} steps per side after {warmup} warm-up, alternating, order flipped; "
            f"each side in its own caller and callee processes, {threads}"
        )
        times = _measure(sides, rounds, warmup, number)
        ratios = _report(times, args.path, args.layer, settings)
    finally:
        clean = all([side.close() for side in sides.values()])
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"path": args.path, "threads": args.threads, "ratios": ratios, "seconds": times, "run": run_info()}
            )
            + "\n"
        )
    worst = max(ratios, key=lambda f: ratios[f])
    print(f"headline: the larger median ratio ({worst}), TensorPipe {args.path}")
    print(f"ratio {LABELS[0]}/{LABELS[1]}: {format_ratio(ratios[worst])}x")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
