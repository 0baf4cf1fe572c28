"""A small harness for side-by-side benchmarks: rallypoint against torch, in the same run.

Machines here are noisy, so a benchmark never reports an absolute time on its own: it times two
things (side A and side B) alternately in one process, after a warm-up, and reports the ratio of
their medians. Within each round both sides run once; the order flips every round (A B, then
B A, then A B...) so that slow drift (thermal, caches, a neighbour's load) hits both sides alike.

A side is any zero-argument callable. :class:`Command` makes one from an argv list (with extra
environment variables) that runs the whole command in a fresh process, so "time to run
``torchrun ...``" and "time to call ``fn()``" use the same machinery.

The report is a table (median, min, max per side) whose last line is the headline ratio, always
in the form matched by :data:`RATIO_RE`::

    ratio rallypoint/torch: 0.421x

Typical benchmark script (each one runnable alone with ``--help``; ``--smoke`` for CI)::

    from tools.bench.harness import Command, bench_parser, run_benchmark

    def main(argv=None):
        args = bench_parser(__doc__).parse_args(argv)
        a = Command(["rallypoint", "--help"])
        b = Command(["torchrun", "--help"])
        run_benchmark(args, a, b, labels=("rallypoint", "torch"), title="CLI start-up")
        return 0

This module must stay light: it never imports torch (nor anything heavy), so that importing the
harness does not disturb what it measures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "RATIO_RE",
    "ensure_bytecode",
    "SMOKE_ROUNDS",
    "SMOKE_WARMUP",
    "BenchmarkError",
    "Command",
    "Comparison",
    "Stats",
    "bench_parser",
    "compare",
    "find_executable",
    "format_duration",
    "format_ratio",
    "format_report",
    "parse_ratio_line",
    "ratio_line",
    "run_benchmark",
    "run_info",
    "schedule",
    "settings_from_args",
]

#: The headline line every benchmark prints last: ``ratio <label A>/<label B>: <A/B>x``.
RATIO_RE = re.compile(r"^ratio (?P<a>[A-Za-z0-9_.+-]+)/(?P<b>[A-Za-z0-9_.+-]+): (?P<ratio>[0-9.]+|inf|nan)x$")
_LABEL_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")

#: ``--smoke`` settings (CI): enough to prove the benchmark runs, not to measure anything.
SMOKE_WARMUP = 1
SMOKE_ROUNDS = 2

Side = Callable[[], Any]


class BenchmarkError(RuntimeError):
    """A benchmark could not run (a command failed, an executable is missing, bad settings)."""


# ------------------------------------------------------------------------------------------------
# Sides


def ensure_bytecode() -> int:
    """Compile the workspace's own sources to bytecode, as a pip-installed wheel would have them.

    Editable installs have no ``.pyc`` files until Python writes them, and with
    ``PYTHONDONTWRITEBYTECODE`` set it never does, so every run would recompile rallypoint while
    torch loads its precompiled files: an unfair start-up penalty that no real install has.
    Returns the number of source trees compiled.
    """
    import compileall

    root = Path(__file__).resolve().parents[2]
    trees = sorted([*root.glob("packages/*/src"), *root.glob("plugins/*/src")])
    for tree in trees:
        compileall.compile_dir(str(tree), quiet=1)
    return len(trees)


def find_executable(name: str) -> str:
    """Absolute path of the console script ``name``.

    Looks next to the running interpreter first (the virtual environment the benchmark runs
    in, even when it is not activated), then on ``PATH``.

    Raises:
        BenchmarkError: not found; the message says what to install.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    raise BenchmarkError(
        f"executable {name!r} not found next to {sys.executable} nor on PATH; "
        f"install it in this environment (see tools/bench/README.md)"
    )


@dataclass(frozen=True)
class Command:
    """A whole command as a benchmark side: calling it runs ``argv`` to completion.

    Attributes:
        argv: the program and its arguments.
        env: extra environment variables, added to the current environment (or replacing it
            when ``inherit_env`` is false).
        inherit_env: start from :data:`os.environ`.
        cwd: working directory of the command.
        timeout: seconds before the command is killed and the benchmark fails.
        ok_codes: exit codes that count as success.

    Output is captured (not shown); a failing command raises :class:`BenchmarkError` with the
    end of its stderr, since timing a command that failed early would be meaningless.
    """

    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    inherit_env: bool = True
    cwd: str | os.PathLike[str] | None = None
    timeout: float | None = 300.0
    ok_codes: tuple[int, ...] = (0,)
    _environ: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.argv:
            raise BenchmarkError("a Command needs at least a program name")
        # Build the environment once, outside the timed call.
        environ = dict(os.environ) if self.inherit_env else {}
        environ.update(self.env or {})
        object.__setattr__(self, "_environ", environ)

    def __call__(self) -> None:
        """Run the command once; raise :class:`BenchmarkError` if it fails."""
        try:
            proc = subprocess.run(
                list(self.argv),
                env=self._environ,
                cwd=self.cwd,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                check=False,
            )
        except FileNotFoundError as exc:
            raise BenchmarkError(f"cannot run {self.describe()}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise BenchmarkError(f"{self.describe()} took longer than {self.timeout:g}s") from exc
        if proc.returncode not in self.ok_codes:
            tail = proc.stderr.decode(errors="replace").strip().splitlines()[-10:]
            raise BenchmarkError(
                f"{self.describe()} exited with {proc.returncode}; last stderr lines:\n  " + "\n  ".join(tail)
            )

    def describe(self) -> str:
        """The command as a person would type it (program name without its directory)."""
        words = [Path(self.argv[0]).name, *self.argv[1:]]
        return " ".join(w if w and " " not in w else repr(w) for w in words)


# ------------------------------------------------------------------------------------------------
# Measuring


def schedule(rounds: int, *, start: int = 0) -> list[tuple[str, str]]:
    """The order of the two sides in each round: ``("a", "b")``, then ``("b", "a")``, and so on.

    ``start`` is the index of the first round (warm-up rounds come before the measured ones, so
    the measured rounds continue the alternation rather than restart it).

    >>> schedule(3)
    [('a', 'b'), ('b', 'a'), ('a', 'b')]
    """
    return [("a", "b") if (start + i) % 2 == 0 else ("b", "a") for i in range(rounds)]


@dataclass(frozen=True)
class Stats:
    """Summary of one side's samples (seconds per call)."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        """Median of the samples."""
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        """Fastest sample."""
        return min(self.samples)

    @property
    def max(self) -> float:
        """Slowest sample."""
        return max(self.samples)


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare`.

    Attributes:
        labels: the two sides' names, as in the ratio line (A first).
        a, b: each side's samples.
        warmup, rounds: the settings used.
        number: calls per sample (each sample is the mean over ``number`` calls).
        order: the sides in the order they were measured (``"a"``/``"b"``), warm-up excluded.
    """

    labels: tuple[str, str]
    a: Stats
    b: Stats
    warmup: int
    rounds: int
    number: int = 1
    order: tuple[str, ...] = ()

    @property
    def ratio(self) -> float:
        """Median of A over median of B (below 1: A is faster)."""
        if self.b.median == 0:
            return math.inf if self.a.median > 0 else math.nan
        return self.a.median / self.b.median

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "labels": list(self.labels),
            "warmup": self.warmup,
            "rounds": self.rounds,
            "number": self.number,
            "ratio": self.ratio,
            "sides": {
                label: {"median": s.median, "min": s.min, "max": s.max, "samples": list(s.samples)}
                for label, s in zip(self.labels, (self.a, self.b), strict=True)
            },
        }


def _check_label(label: str) -> str:
    if not _LABEL_RE.match(label):
        raise BenchmarkError(f"label {label!r} must be one word (letters, digits, '_', '.', '+', '-')")
    return label


def compare(
    a: Side,
    b: Side,
    *,
    rounds: int = 10,
    warmup: int = 1,
    number: int = 1,
    labels: tuple[str, str] = ("A", "B"),
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[int, str, float], None] | None = None,
) -> Comparison:
    """Time ``a`` and ``b`` alternately and return both sides' samples.

    Each round calls each side ``number`` times in a row and records the mean time per call;
    the order of the sides flips every round (see :func:`schedule`). ``warmup`` rounds run
    first, alternating the same way, and are discarded.

    Args:
        a, b: zero-argument callables (a :class:`Command` for whole commands).
        rounds: measured rounds (each side gets one sample per round).
        warmup: rounds run and thrown away before measuring (imports, caches, page cache).
        number: calls per sample, for operations too short to time one at a time.
        labels: names of A and B, one word each (they appear in the ratio line).
        clock: the timer; tests pass a fake one.
        progress: called after each measured sample with ``(round, label, seconds)``.

    Raises:
        BenchmarkError: bad settings, or a side raised it (a failing command).
    """
    if rounds < 1 or warmup < 0 or number < 1:
        raise BenchmarkError(f"need rounds >= 1, warmup >= 0, number >= 1 (got {rounds}, {warmup}, {number})")
    labels = (_check_label(labels[0]), _check_label(labels[1]))
    sides = {"a": a, "b": b}
    names = {"a": labels[0], "b": labels[1]}

    def sample(key: str) -> float:
        fn = sides[key]
        start = clock()
        for _ in range(number):
            fn()
        return (clock() - start) / number

    for first, second in schedule(warmup):
        sample(first)
        sample(second)

    samples: dict[str, list[float]] = {"a": [], "b": []}
    order: list[str] = []
    for i, pair in enumerate(schedule(rounds, start=warmup)):
        for key in pair:
            seconds = sample(key)
            samples[key].append(seconds)
            order.append(key)
            if progress is not None:
                progress(i, names[key], seconds)
    return Comparison(
        labels=labels,
        a=Stats(tuple(samples["a"])),
        b=Stats(tuple(samples["b"])),
        warmup=warmup,
        rounds=rounds,
        number=number,
        order=tuple(order),
    )


# ------------------------------------------------------------------------------------------------
# Reporting


def format_duration(seconds: float) -> str:
    """Seconds in a unit that keeps 3-4 significant digits.

    >>> format_duration(2.5), format_duration(0.0123), format_duration(4.2e-6)
    ('2.500 s', '12.30 ms', '4.200 us')
    """
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            value = seconds / scale
            return f"{value:.{3 if value < 10 else 2 if value < 100 else 1}f} {unit}"
    return f"{seconds * 1e9:.1f} ns"


def format_ratio(ratio: float) -> str:
    """A ratio with three significant digits and no exponent.

    >>> format_ratio(0.4213), format_ratio(0.04213), format_ratio(1.5), format_ratio(123.4)
    ('0.421', '0.0421', '1.50', '123')
    """
    if math.isnan(ratio):
        return "nan"
    if math.isinf(ratio):
        return "inf"
    if ratio <= 0:
        return "0.000"
    decimals = max(0, 2 - math.floor(math.log10(ratio)))
    return f"{ratio:.{decimals}f}"


def ratio_line(comparison: Comparison) -> str:
    """The headline: ``ratio <A>/<B>: <median A / median B>x``."""
    a, b = comparison.labels
    return f"ratio {a}/{b}: {format_ratio(comparison.ratio)}x"


def parse_ratio_line(text: str) -> tuple[str, str, float]:
    """Read the last line of a benchmark's output back: ``(label A, label B, ratio)``.

    >>> parse_ratio_line("table...\\nratio rallypoint/torch: 0.421x\\n")
    ('rallypoint', 'torch', 0.421)

    Raises:
        ValueError: the last non-empty line is not a ratio line.
    """
    lines = [line for line in text.strip().splitlines() if line.strip()]
    match = RATIO_RE.match(lines[-1].strip()) if lines else None
    if match is None:
        raise ValueError(f"last line is not a ratio line: {lines[-1] if lines else '(no output)'!r}")
    return match["a"], match["b"], float(match["ratio"])


def format_report(comparison: Comparison, *, title: str = "", details: Sequence[str] = ()) -> str:
    """The report table; its last line is :func:`ratio_line`.

    Args:
        comparison: what :func:`compare` returned.
        title: first line, e.g. the benchmark's name and what it measures.
        details: extra lines under the title (the two commands, payload sizes...).
    """
    c = comparison
    per = f", {c.number} calls per sample" if c.number > 1 else ""
    lines = [title] if title else []
    lines.extend(details)
    lines.append(f"{c.rounds} rounds after {c.warmup} warm-up, sides alternate and flip order each round{per}")
    width = max(len("side"), *(len(label) for label in c.labels))
    header = f"{'side':<{width}}  {'median':>11}  {'min':>11}  {'max':>11}  {'n':>4}"
    lines.append(header)
    lines.append("-" * len(header))
    for label, s in zip(c.labels, (c.a, c.b), strict=True):
        lines.append(
            f"{label:<{width}}  {format_duration(s.median):>11}  {format_duration(s.min):>11}  "
            f"{format_duration(s.max):>11}  {len(s.samples):>4}"
        )
    lines.append(ratio_line(c))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Command line


def bench_parser(
    description: str | None, *, rounds: int = 10, warmup: int = 1, number: int = 1, prog: str | None = None
) -> argparse.ArgumentParser:
    """An :class:`argparse.ArgumentParser` with the options every benchmark shares.

    ``--rounds``, ``--warmup``, ``--number``, ``--smoke`` (1 warm-up, 2 rounds: for CI),
    ``--json FILE`` (write the samples) and ``--verbose`` (each sample on stderr). Add the
    benchmark's own options to the returned parser.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The last line printed is the headline, e.g. 'ratio rallypoint/torch: 0.421x' "
        "(median A / median B; below 1 means A is faster).",
    )
    group = parser.add_argument_group("harness")
    group.add_argument(
        "--rounds",
        type=int,
        default=rounds,
        metavar="N",
        help=f"measured rounds; each side runs once per round (default {rounds})",
    )
    group.add_argument(
        "--warmup", type=int, default=warmup, metavar="N", help=f"warm-up rounds, discarded (default {warmup})"
    )
    group.add_argument(
        "--number",
        type=int,
        default=number,
        metavar="K",
        help=f"calls per sample, for very short operations (default {number})",
    )
    group.add_argument(
        "--smoke",
        action="store_true",
        help=f"CI mode: {SMOKE_WARMUP} warm-up and {SMOKE_ROUNDS} rounds, overriding the above",
    )
    group.add_argument("--json", metavar="FILE", help="also write the samples and the ratio to FILE as JSON")
    group.add_argument("--verbose", "-v", action="store_true", help="print every sample on stderr as it is taken")
    return parser


def settings_from_args(args: argparse.Namespace) -> dict[str, int]:
    """``rounds``, ``warmup`` and ``number`` for :func:`compare`, honouring ``--smoke``."""
    if getattr(args, "smoke", False):
        return {"rounds": SMOKE_ROUNDS, "warmup": SMOKE_WARMUP, "number": 1}
    return {"rounds": args.rounds, "warmup": args.warmup, "number": getattr(args, "number", 1)}


def run_info(argv: Sequence[str] | None = None) -> dict[str, str]:
    """What a stored result must say about its run: ``date``, ``command`` and ``machine``.

    The date is now (UTC, to the minute), the command this process's (``argv``, default
    ``sys.argv``, the script's path relative to the working directory where it lies below it),
    and the machine its CPU count and load averages as they are now (at the end of a run). Every
    ``--json`` file of ``tools/bench`` carries it under ``"run"``: the same keys as a run in
    ``docs/bench/*.json`` (:mod:`tools.bench.results`), which adds only where it was recorded.
    """
    args = list(sys.argv if argv is None else argv)
    if args:
        script = Path(args[0])
        with contextlib.suppress(ValueError):
            script = script.resolve().relative_to(Path.cwd())
        args[0] = str(script)
    load = os.getloadavg()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": shlex.join(["python", *args]),
        "machine": f"{os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the end",
    }


def run_benchmark(
    args: argparse.Namespace,
    a: Side,
    b: Side,
    *,
    labels: tuple[str, str],
    title: str = "",
    details: Sequence[str] = (),
    out: Any = None,
) -> Comparison:
    """Compare ``a`` and ``b`` with the settings in ``args`` and print the report.

    The report goes to ``out`` (default stdout) and ends with the ratio line; ``--verbose``
    samples go to stderr; ``--json FILE`` writes :meth:`Comparison.as_dict` plus the title.
    """
    out = sys.stdout if out is None else out
    progress = None
    if getattr(args, "verbose", False):

        def progress(i: int, label: str, seconds: float) -> None:
            print(f"round {i}: {label} {format_duration(seconds)}", file=sys.stderr, flush=True)

    comparison = compare(a, b, labels=labels, progress=progress, **settings_from_args(args))
    if getattr(args, "json", None):
        data = {"title": title, "details": list(details), **comparison.as_dict(), "run": run_info()}
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    print(format_report(comparison, title=title, details=details), file=out, flush=True)
    return comparison
