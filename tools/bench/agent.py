"""The agent against torchrun: whole command (P1, P1w), restart latency (P3, P3b), agent memory (P8).

Five measures, each side by side with torch in the same run (sides alternate, the order flips
every round, medians are compared). Jobs run in a temporary directory removed at the end
(P3 gives each sample its own output directory), on loopback only (``GLOO_SOCKET_IFNAME=lo``
for both sides):

* P1, whole command: ``rallypoint run --nproc-per-node 2 trivial.py`` against ``torchrun
  --standalone --nproc-per-node 2 trivial.py``, timed from spawn to exit. ``trivial.py`` (written
  by the benchmark) does ``init_process_group("gloo")``, one ``all_reduce`` (checked) and
  ``destroy_process_group()``; a non-zero exit fails the benchmark. The details also report our
  agent's start-up: ``rallypoint --version``, a bare ``python -c pass``, importing the agent and
  the rendezvous handler, and (for scale) ``import torch``. Target <= 0.6x.
* P3, restart latency: the same job under both launchers with one restart allowed and a 0.1 s
  monitor interval (``--max-restarts 1``; ``--monitor-interval 100ms`` / ``0.1``). On attempt 0
  (``TORCHELASTIC_RESTART_COUNT == "0"``) both ranks record that they started, then rank 1, once
  both are up, records ``time.time()`` and SIGKILLs itself. On attempt 1 each worker records
  ``time.time()`` on its very first line (no torch import at all) and exits 0. A sample is
  ``max(first-line times of attempt 1) - kill time``; the command must exit 0 and every file
  must be there (so both launchers restarted exactly once). Target <= 0.5x.
* P8, agent peak resident memory: the trivial job (workers also sleep 2 s) under each
  launcher, reading the agent's ``VmHWM`` from ``/proc/<pid>/status`` every 20 ms until it
  exits (the agent is the ``rallypoint`` process; torchrun's is the ``torchrun`` process).
  Samples are MiB, not seconds. Target <= 0.3x.
* P1w, whole command with warm workers: P1's job with ``--preload torch`` on our side (one warm
  process per node imports torch once, while the rendezvous runs, and forks both workers)
  against the same ``torchrun`` command. Target <= 0.3x.
* P1k, whole command with a kept warm process: P1w with ``--preload-keep 10m`` on our side, and
  one unmeasured priming run before the comparison, so that every measured command finds the
  warm process (torch imported) left by the previous one and only forks the workers: the steady
  state of a node that ran a job in the last 10 minutes. The first run on a node costs P1w. It
  uses a runtime directory of its own (``XDG_RUNTIME_DIR``), checks that one warm process served
  every round, and stops it at the end. Target <= 0.3x (P1w's).
* P3b, restart of a job that imports torch: ``restart_torch.py`` imports torch, runs
  ``init_process_group("gloo")`` and one checked ``all_reduce`` (its first training step), then
  records ``time.time()``. On attempt 0 rank 1, once both ranks stepped, records ``time.time()``
  and SIGKILLs itself; a sample is ``max(first step of the attempt-1 workers) - kill time``: the
  whole restart as a job sees it (detection, stop, re-rendezvous, start, torch import, process
  group). Ours runs with ``--preload torch`` (restarted workers are forked, no new import),
  both with ``--max-restarts 1`` and a 0.1 s monitor interval. Target <= 0.2x. A run still
  going after ``--p3b-timeout`` seconds (60 by default; torchrun's restarted gloo workers
  sometimes hang) is killed with every process under it, listed as ``torchrun hung (60 s)``
  and excluded, not repeated; the medians are over the other rounds, and the table says how
  many runs of each side were excluded.

Run from the repository root:

    .venv/bin/python tools/bench/agent.py --rounds 5          # P1, P3, P8, P1w, P1k and P3b
    .venv/bin/python tools/bench/agent.py --only p3           # one measure
    .venv/bin/python tools/bench/agent.py --smoke --only p1   # CI: 1 warm-up, 2 rounds

The last line is the ratio of the first measure run (P1 when all three run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import (
    BenchmarkError,
    Command,
    Comparison,
    Stats,
    bench_parser,
    compare,
    ensure_bytecode,
    find_executable,
    format_duration,
    format_ratio,
    format_report,
    ratio_line,
    run_info,
    schedule,
    settings_from_args,
)

MEASURES = ("p1", "p3", "p8", "p1w", "p1k", "p3b")
TARGETS = {"p1": 0.6, "p3": 0.5, "p8": 0.3, "p1w": 0.3, "p1k": 0.3, "p3b": 0.2}
LABELS = ("rallypoint", "torch")
#: Seconds one launcher command may take before it is killed and the benchmark fails.
COMMAND_TIMEOUT = 120.0
#: P3b: how many times a run whose restart failed is repeated for one sample (each one is reported).
#: torchrun's restarted gloo workers failed or hung in about half the runs on the loaded machine.
P3B_RETRIES = 5
#: P3b: seconds one run may take; a run past it (a hung restart) is killed and excluded, and counted.
P3B_TIMEOUT = 60.0
#: P1k: how long the kept warm process stays after each run (longer than the whole measure).
P1K_KEEP = "10m"
#: How often P8 reads the agent's /proc/<pid>/status.
MEMORY_POLL = 0.02
#: Environment for both sides: loopback only, no stray settings from the caller's shell.
BASE_ENV = {"GLOO_SOCKET_IFNAME": "lo"}
_DROP_ENV = ("TORCHELASTIC_RESTART_COUNT", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")

TRIVIAL = """\
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if t.item() != dist.get_world_size():
    sys.exit(f"all_reduce gave {t.item()}, expected {dist.get_world_size()}")
dist.destroy_process_group()
if len(sys.argv) > 1:
    time.sleep(float(sys.argv[1]))
"""

RESTART = """\
import time; FIRST = time.time()  # the very first line: no import before it but time
import os
import signal
import sys

out = os.environ["RP_BENCH_OUT"]
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
rank = os.environ.get("RANK", "?")


def write(name, value):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(repr(value))
    os.replace(tmp, os.path.join(out, name))


if attempt != "0":
    write(f"first-{attempt}-{rank}", FIRST)
    sys.exit(0)
write(f"started-0-{rank}", time.time())
if rank != "1":
    time.sleep(60)  # the launcher stops this worker after rank 1 dies
    sys.exit(3)
deadline = time.time() + 60
while not os.path.exists(os.path.join(out, "started-0-0")):
    if time.time() > deadline:
        sys.exit(4)
    time.sleep(0.005)
killed = time.time()
write("kill", killed)
os.kill(os.getpid(), signal.SIGKILL)
"""


RESTART_TORCH = """\
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

out = os.environ["RP_BENCH_OUT"]
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
rank = os.environ.get("RANK", "?")


def write(name, value):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(repr(value))
    os.replace(tmp, os.path.join(out, name))


dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)  # the first training step
if t.item() != dist.get_world_size():
    sys.exit(f"all_reduce gave {t.item()}, expected {dist.get_world_size()}")
STEP = time.time()
if attempt != "0":
    write(f"step-{attempt}-{rank}", STEP)
    dist.destroy_process_group()
    sys.exit(0)
write(f"started-0-{rank}", STEP)
if rank != "1":
    time.sleep(60)  # the launcher stops this worker after rank 1 dies
    sys.exit(3)
deadline = time.time() + 60
while not os.path.exists(os.path.join(out, "started-0-0")):
    if time.time() > deadline:
        sys.exit(4)
    time.sleep(0.005)
killed = time.time()
write("kill", killed)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env.update(BASE_ENV)
    env.update(extra or {})
    return env


def _launchers(script: str, *, restarts: bool = False, preload: bool = False) -> tuple[list[str], list[str]]:
    """The rallypoint and torchrun command lines for ``script`` (a path relative to the cwd)."""
    ours = [find_executable("rallypoint"), "run", "--nproc-per-node", "2"]
    if preload:
        ours += ["--preload", "torch"]
    theirs = [find_executable("torchrun"), "--standalone", "--nproc-per-node", "2"]
    if restarts:
        ours += ["--max-restarts", "1", "--monitor-interval", "100ms"]
        theirs += ["--max-restarts", "1", "--monitor-interval", "0.1"]
    return [*ours, script], [*theirs, script]


def _describe(argv: Sequence[str]) -> str:
    return " ".join([Path(argv[0]).name, *argv[1:]])


def _tail(text: bytes | str | None, lines: int = 10) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n  ".join((text or "").strip().splitlines()[-lines:])


class Hung(BenchmarkError):
    """A launcher command ran past its timeout; it and every process under it were killed."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name: state, ppid, ... (raises OSError when gone)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (whatever session or group it moved to), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children.setdefault(int(_stat(entry)[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (no such process, or a zombie left to its parent)."""
    try:
        return _stat(pid)[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _kill_tree(proc: subprocess.Popen[bytes], settle: float = 5.0) -> None:
    """SIGKILL ``proc`` and everything under it (a hung torchrun leaves workers holding the port).

    Returns once they have all exited (or after ``settle`` seconds): a SIGKILLed process still
    runs until the kernel schedules its exit, and on a busy machine the next run could otherwise
    start beside workers that still hold the port (the CI saw one alive right after the kill).
    """
    victims = [*_descendants(proc.pid), proc.pid]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + settle
    while not all(_gone(pid) for pid in victims) and time.monotonic() < deadline:
        time.sleep(0.01)


def _run(argv: Sequence[str], cwd: str, env: dict[str, str], what: str, timeout: float = COMMAND_TIMEOUT) -> None:
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_tree(proc)
        raise Hung(f"{what}: {_describe(argv)} took longer than {timeout:g}s", timeout) from exc
    finally:
        if proc.poll() is None:  # interrupted
            _kill_tree(proc)
    if proc.returncode != 0:
        output = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout or ""
        errors = [
            line.strip()
            for line in output.splitlines()
            if re.search(r"\w+Error: ", line) and "ChildFailedError" not in line  # torchrun's own summary
        ]
        cause = f"; the last error line: {errors[-1]}" if errors else ""
        raise BenchmarkError(
            f"{what}: {_describe(argv)} exited with {proc.returncode}{cause}; last lines:\n  {_tail(stdout)}"
        )


class VirtualClock:
    """A clock for :func:`compare` that moves only by what a side measured (seconds or MiB)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _progress(verbose: bool, name: str, fmt: Callable[[float], str]) -> Callable[[int, str, float], None] | None:
    if not verbose:
        return None

    def progress(i: int, label: str, value: float) -> None:
        print(f"{name} round {i}: {label} {fmt(value)}", file=sys.stderr, flush=True)

    return progress


# ------------------------------------------------------------------------------------------------
# P1: whole command, plus our agent's start-up


def _startup_figures(rounds: int, warmup: int) -> list[str]:
    """Median spawn-to-exit of small commands, rotating their order each round."""
    py = sys.executable
    commands = {
        "python -c pass": Command([py, "-c", "pass"], env=BASE_ENV),
        "rallypoint --version": Command([find_executable("rallypoint"), "--version"], env=BASE_ENV),
        "import rallypoint.agent.agent, rallypoint.rendezvous.handler": Command(
            [py, "-c", "import rallypoint.agent.agent, rallypoint.rendezvous.handler"], env=BASE_ENV
        ),
        "import torch": Command([py, "-c", "import torch"], env=BASE_ENV),
    }
    names = list(commands)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            commands[name]()
            if r >= warmup:
                samples[name].append(time.perf_counter() - start)
    med = {n: statistics.median(s) for n, s in samples.items()}
    bare = med["python -c pass"]
    lines = [f"our agent's start-up, spawn to exit, median of {rounds} (report only):"]
    width = max(len(n) for n in names)
    for name in names:
        extra = ""
        if name != "python -c pass":
            scale = "for scale: " if name == "import torch" else ""
            extra = f"  ({scale}+{format_duration(med[name] - bare)} over bare python)"
        lines.append(f"  {name:<{width}} {format_duration(med[name]):>10}{extra}")
    return lines


def measure_p1(args: argparse.Namespace, workdir: str) -> Comparison:
    settings = settings_from_args(args)
    (Path(workdir) / "trivial.py").write_text(TRIVIAL)
    ours, theirs = _launchers("trivial.py")
    env = _environ()
    a = Command(ours, env=env, inherit_env=False, cwd=workdir, timeout=COMMAND_TIMEOUT)
    b = Command(theirs, env=env, inherit_env=False, cwd=workdir, timeout=COMMAND_TIMEOUT)
    details = [
        "trivial.py: init_process_group('gloo'), one all_reduce (checked), destroy_process_group()",
        f"A rallypoint: {a.describe()}",
        f"B torch:      {b.describe()}",
        *_startup_figures(settings["rounds"], settings["warmup"]),
    ]
    return _measure(args, "P1", a, b, title="P1 agent: whole command, spawn to exit", details=details)


def _measure(
    args: argparse.Namespace,
    name: str,
    a: Any,
    b: Any,
    *,
    title: str,
    details: Sequence[str],
    clock: Any = None,
    unit: Callable[[float], str] = format_duration,
    report: Callable[..., str] = format_report,
) -> Comparison:
    """Compare the two sides with the command line's settings and print the measure's table."""
    comparison = compare(
        a,
        b,
        labels=LABELS,
        progress=_progress(args.verbose, name, unit),
        clock=clock if clock is not None else time.perf_counter,
        rounds=settings_from_args(args)["rounds"],
        warmup=settings_from_args(args)["warmup"],
    )
    print(report(comparison, title=title, details=details), flush=True)
    return comparison


# ------------------------------------------------------------------------------------------------
# P3: restart latency


def _failure_reason(message: str) -> str:
    """``exited with 1 (RuntimeError: ...)`` or ``took longer than 120s`` from a failed run's error."""
    found = re.search(r"(exited with -?\d+|took longer than \S+)", message)
    reason = found.group(1) if found else message.strip().splitlines()[0][:120]
    error = re.search(r"the last error line: (.*?); last lines:", message)
    return f"{reason} ({error.group(1)[:200]})" if error else reason


class RestartSide:
    """One call: run the restart job under one launcher; the clock advances by the latency."""

    def __init__(
        self,
        argv: list[str],
        workdir: str,
        clock: VirtualClock,
        name: str,
        *,
        mark: str = "first",
        retries: int = 0,
        notes: list[str] | None = None,
        timeout: float = COMMAND_TIMEOUT,
    ) -> None:
        self.argv = argv
        self.timeout = timeout
        self.hung = 0  # runs that ran past the timeout (P3b: excluded, counted)
        self.workdir = workdir
        self.clock = clock
        self.name = name
        self.mark = mark  # what attempt 1's workers record: "first" (line) or "step" (P3b)
        self.retries = retries  # failed runs repeated (each one reported in notes), then the error stands
        self.notes = notes if notes is not None else []

    def __call__(self) -> None:
        for attempt in range(self.retries + 1):
            try:
                self.clock.now += self.run_once()
                return
            except BenchmarkError as exc:
                if attempt == self.retries or (isinstance(exc, Hung) and self.mark == "step"):
                    raise  # P3b: a hung run is not repeated, sample() excludes it
                self.notes.append(f"  repeated a failed {self.name} run: {_failure_reason(str(exc))}")

    def sample(self, where: str) -> float | None:
        """One sample (failed runs repeated as by a call), or ``None`` when the run hung: excluded, noted."""
        before = self.clock.now
        try:
            self()
        except Hung as exc:
            self.hung += 1
            self.notes.append(f"  {where}: {self.name} hung ({exc.seconds:g} s), killed, excluded")
            return None
        return self.clock.now - before

    def run_once(self) -> float:
        out = tempfile.mkdtemp(prefix="out-", dir=self.workdir)
        what = "P3" if self.mark == "first" else "P3b"
        try:
            _run(self.argv, self.workdir, _environ({"RP_BENCH_OUT": out}), f"{what} {self.name}", self.timeout)
            files = {p.name: p for p in Path(out).iterdir()}
            expected = {"started-0-0", "started-0-1", "kill", f"{self.mark}-1-0", f"{self.mark}-1-1"}
            if set(files) != expected:
                raise BenchmarkError(
                    f"{what} {self.name}: expected exactly one restart (files {sorted(expected)}), "
                    f"found {sorted(files)}"
                )
            values = {n: float(p.read_text()) for n, p in files.items()}
            latency = max(values[f"{self.mark}-1-0"], values[f"{self.mark}-1-1"]) - values["kill"]
            if not 0 < latency < COMMAND_TIMEOUT:
                raise BenchmarkError(f"{what} {self.name}: impossible restart latency {latency!r} s")
            return latency
        finally:
            shutil.rmtree(out, ignore_errors=True)


def measure_p3(args: argparse.Namespace, workdir: str) -> Comparison:
    (Path(workdir) / "restart.py").write_text(RESTART)
    ours, theirs = _launchers("restart.py", restarts=True)
    clock = VirtualClock()
    a = RestartSide(ours, workdir, clock, "rallypoint")
    b = RestartSide(theirs, workdir, clock, "torch")
    details = [
        "restart.py attempt 0: rank 1 SIGKILLs itself once both ranks run; attempt 1: time.time() on line 1, exit 0",
        f"A rallypoint: {_describe(ours)}",
        f"B torch:      {_describe(theirs)}",
        "sample: max(first line of the attempt-1 workers) - time.time() just before os.kill",
    ]
    return _measure(
        args,
        "P3",
        a,
        b,
        clock=clock,
        title="P3 agent: restart latency, SIGKILL to all new workers' first line",
        details=details,
    )


# ------------------------------------------------------------------------------------------------
# P1w and P3b: warm workers (--preload torch)


class _Joined(Sequence[str]):
    """Two lists read as one when the report is printed (the notes fill up while measuring)."""

    def __init__(self, first: list[str], second: list[str]) -> None:
        self.first = first
        self.second = second

    def _all(self) -> list[str]:
        return [*self.first, *(self.second or ["  (none)"])]

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, index: Any) -> Any:
        return self._all()[index]


def measure_p1w(args: argparse.Namespace, workdir: str) -> Comparison:
    (Path(workdir) / "trivial.py").write_text(TRIVIAL)
    ours, theirs = _launchers("trivial.py", preload=True)
    env = _environ()
    a = Command(ours, env=env, inherit_env=False, cwd=workdir, timeout=COMMAND_TIMEOUT)
    b = Command(theirs, env=env, inherit_env=False, cwd=workdir, timeout=COMMAND_TIMEOUT)
    details = [
        "trivial.py: init_process_group('gloo'), one all_reduce (checked), destroy_process_group()",
        f"A rallypoint: {a.describe()}  (one warm process imports torch; both workers forked from it)",
        f"B torch:      {b.describe()}",
    ]
    return _measure(
        args, "P1w", a, b, title="P1w agent: whole command with warm workers, spawn to exit", details=details
    )


def _kept_pids(env: dict[str, str]) -> list[int]:
    """The pids of the kept warm processes in ``env``'s runtime directory (``rallypoint warm list``)."""
    listed = subprocess.run(
        [find_executable("rallypoint"), "warm", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=True,
    )
    return sorted(int(json.loads(line)["pid"]) for line in listed.stdout.splitlines() if line.strip())


def measure_p1k(args: argparse.Namespace, workdir: str) -> Comparison:
    (Path(workdir) / "trivial.py").write_text(TRIVIAL)
    ours, theirs = _launchers("trivial.py", preload=True)
    ours = [*ours[:-1], "--preload-keep", P1K_KEEP, ours[-1]]
    runtime = tempfile.mkdtemp(prefix="rpk-")  # its own kept warm process; a short path (a Unix socket's)
    env = {**_environ(), "XDG_RUNTIME_DIR": runtime}
    a = Command(ours, env=env, inherit_env=False, cwd=workdir, timeout=COMMAND_TIMEOUT)
    b = Command(theirs, env=_environ(), inherit_env=False, cwd=workdir, timeout=COMMAND_TIMEOUT)
    try:
        _run(ours, workdir, env, "P1k priming run")  # starts the warm process: this first run costs P1w
        kept = _kept_pids(env)
        if len(kept) != 1:
            raise BenchmarkError(f"P1k: the priming run left {len(kept)} kept warm process(es), expected 1")
        details = [
            "trivial.py: init_process_group('gloo'), one all_reduce (checked), destroy_process_group()",
            f"A rallypoint: {a.describe()}",
            f"B torch:      {b.describe()}",
            f"steady state of a node that ran a job in the last {P1K_KEEP}: every measured command finds the warm",
            f"  process (pid {kept[0]}, torch imported) kept by an unmeasured priming run and forks both workers from",
            "  it; the first run on a node costs what P1w measures",
        ]
        comparison = _measure(
            args,
            "P1k",
            a,
            b,
            title="P1k agent: whole command with the warm process kept from a previous run, spawn to exit",
            details=details,
        )
        if _kept_pids(env) != kept:
            raise BenchmarkError(f"P1k: the kept warm process {kept[0]} was replaced while measuring")
        return comparison
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([find_executable("rallypoint"), "warm", "stop"], env=env, capture_output=True, timeout=30)
        shutil.rmtree(runtime, ignore_errors=True)


def _without_preload(args: argparse.Namespace, workdir: str, notes: list[str]) -> str:
    """Our P3b without ``--preload`` (report only, before the comparison): what the warm process saves."""
    plain, _ = _launchers("restart_torch.py", restarts=True)
    clock = VirtualClock()
    side = RestartSide(
        plain, workdir, clock, "rallypoint without --preload", mark="step", retries=P3B_RETRIES, notes=notes
    )
    side.timeout = args.p3b_timeout
    rounds = settings_from_args(args)["rounds"]
    samples = [x for i in range(rounds) if (x := side.sample(f"report-only run {i}")) is not None]
    median = format_duration(statistics.median(samples)) if samples else "every run hung"
    return f"report only, rallypoint without --preload (median of {len(samples)}, run before the comparison): {median}"


def _compare_excluding_hung(args: argparse.Namespace, a: RestartSide, b: RestartSide) -> Comparison:
    """:func:`compare`'s alternation, but a run that hung gives no sample (it is noted and counted)."""
    settings = settings_from_args(args)
    sides = {"a": a, "b": b}
    for i, (first, second) in enumerate(schedule(settings["warmup"])):
        sides[first].sample(f"warm-up {i}")
        sides[second].sample(f"warm-up {i}")
    samples: dict[str, list[float]] = {"a": [], "b": []}
    order: list[str] = []
    progress = _progress(args.verbose, "P3b", format_duration)
    for i, pair in enumerate(schedule(settings["rounds"], start=settings["warmup"])):
        for key in pair:
            value = sides[key].sample(f"round {i}")
            if value is None:
                continue
            samples[key].append(value)
            order.append(key)
            if progress is not None:
                progress(i, LABELS[0 if key == "a" else 1], value)
    for key, side in sides.items():
        if not samples[key]:
            raise BenchmarkError(f"P3b: every {side.name} run hung (> {side.timeout:g} s); nothing to compare")
    return Comparison(
        labels=LABELS,
        a=Stats(tuple(samples["a"])),
        b=Stats(tuple(samples["b"])),
        warmup=settings["warmup"],
        rounds=settings["rounds"],
        order=tuple(order),
    )


def measure_p3b(args: argparse.Namespace, workdir: str) -> Comparison:
    (Path(workdir) / "restart_torch.py").write_text(RESTART_TORCH)
    ours, theirs = _launchers("restart_torch.py", restarts=True, preload=True)
    clock = VirtualClock()
    notes: list[str] = []
    hang = args.p3b_timeout
    a = RestartSide(ours, workdir, clock, "rallypoint", mark="step", retries=P3B_RETRIES, notes=notes, timeout=hang)
    b = RestartSide(theirs, workdir, clock, "torchrun", mark="step", retries=P3B_RETRIES, notes=notes, timeout=hang)
    details = [
        "restart_torch.py: import torch, init_process_group('gloo'), one all_reduce (the first step), time.time();",
        "  attempt 0: rank 1 SIGKILLs itself once both ranks stepped; attempt 1: record the first step, exit 0",
        f"A rallypoint: {_describe(ours)}",
        f"B torch:      {_describe(theirs)}",
        "sample: max(first step of the attempt-1 workers) - time.time() just before os.kill",
        _without_preload(args, workdir, notes),
        f"a run whose restart fails is repeated ({P3B_RETRIES} times at most); a run still going after {hang:g} s "
        "is killed with its workers and excluded (not repeated); each one listed below:",
    ]
    comparison = _compare_excluding_hung(args, a, b)
    counts = f"hung runs excluded (warm-up included): {a.name} {a.hung}, {b.name} {b.hung} (samples: "
    counts += f"{len(comparison.a.samples)} and "
    counts += f"{len(comparison.b.samples)} of {comparison.rounds} rounds)"
    title = "P3b agent: restart of a torch job, SIGKILL to every new worker's first step"
    print(format_report(comparison, title=title, details=[*_Joined(details, notes), counts]), flush=True)
    return comparison


# ------------------------------------------------------------------------------------------------
# P8: agent peak resident memory


def _status_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class MemorySide:
    """One call: run the sleeping trivial job; the clock advances by the agent's peak RSS in MiB."""

    def __init__(self, argv: list[str], workdir: str, clock: VirtualClock, name: str) -> None:
        self.argv = argv
        self.workdir = workdir
        self.clock = clock
        self.name = name

    def __call__(self) -> None:
        self.clock.now += self.run_once()

    def run_once(self) -> float:
        with tempfile.TemporaryFile(dir=self.workdir) as log:
            return self._sample(log)

    def _sample(self, log: Any) -> float:
        proc = subprocess.Popen(
            self.argv,
            cwd=self.workdir,
            env=_environ(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        peak = 0
        reads = 0
        try:
            deadline = time.monotonic() + COMMAND_TIMEOUT
            while proc.poll() is None:
                hwm = _status_kib(proc.pid, "VmHWM")
                if hwm:
                    peak = max(peak, hwm)
                    reads += 1
                if time.monotonic() > deadline:
                    raise BenchmarkError(
                        f"P8 {self.name}: {_describe(self.argv)} took longer than {COMMAND_TIMEOUT:g}s"
                    )
                time.sleep(MEMORY_POLL)
            if proc.returncode != 0:
                log.seek(0)
                raise BenchmarkError(
                    f"P8 {self.name}: {_describe(self.argv)} exited with {proc.returncode}; last lines:\n  "
                    f"{_tail(log.read())}"
                )
            if reads < 10:
                raise BenchmarkError(f"P8 {self.name}: only {reads} memory reads of the agent; cannot trust the peak")
            return peak / 1024.0
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def format_mib(value: float) -> str:
    return f"{value:.1f} MiB"


def format_memory_report(comparison: Comparison, *, title: str, details: Sequence[str]) -> str:
    """Like :func:`format_report`, in MiB; the last line is the ratio line."""
    c = comparison
    lines = [title, *details]
    lines.append(f"{c.rounds} rounds after {c.warmup} warm-up, sides alternate and flip order each round")
    width = max(len("side"), *(len(label) for label in c.labels))
    header = f"{'side':<{width}}  {'median':>11}  {'min':>11}  {'max':>11}  {'n':>4}"
    lines += [header, "-" * len(header)]
    for label, s in zip(c.labels, (c.a, c.b), strict=True):
        lines.append(
            f"{label:<{width}}  {format_mib(s.median):>11}  {format_mib(s.min):>11}  "
            f"{format_mib(s.max):>11}  {len(s.samples):>4}"
        )
    lines.append(ratio_line(c))
    return "\n".join(lines)


def measure_p8(args: argparse.Namespace, workdir: str) -> Comparison:
    (Path(workdir) / "trivial.py").write_text(TRIVIAL)
    ours, theirs = _launchers("trivial.py")
    ours, theirs = [*ours, f"{args.sleep:g}"], [*theirs, f"{args.sleep:g}"]
    clock = VirtualClock()
    a = MemorySide(ours, workdir, clock, "rallypoint")
    b = MemorySide(theirs, workdir, clock, "torch")
    details = [
        f"job: trivial.py, then each worker sleeps {args.sleep:g} s; agent's VmHWM read every "
        f"{MEMORY_POLL * 1000:g} ms until it exits",
        f"A rallypoint: {_describe(ours)}  (agent: the rallypoint process)",
        f"B torch:      {_describe(theirs)}  (agent: the torchrun process)",
    ]
    return _measure(
        args,
        "P8",
        a,
        b,
        clock=clock,
        title="P8 agent: peak resident memory (VmHWM) of the agent process",
        details=details,
        unit=format_mib,
        report=format_memory_report,
    )


# ------------------------------------------------------------------------------------------------
# Command line


def _label(name: str) -> str:
    """``p1`` -> ``P1``, ``p1w`` -> ``P1w``."""
    return name[:2].upper() + name[2:]


def _parse_only(text: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(s.strip().lower() for s in text.split(",") if s.strip()))
    bad = [s for s in chosen if s not in MEASURES]
    if not chosen or bad:
        raise argparse.ArgumentTypeError(
            f"--only wants p1, p3, p8, p1w, p1k and/or p3b (comma-separated), got {text!r}"
        )
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=5, warmup=1)
    parser.add_argument(
        "--only",
        type=_parse_only,
        default=MEASURES,
        metavar="p1|p3|p8|p1w|p1k|p3b",
        help="measure only these (comma-separated; default all six, in the order p1, p3, p8, p1w, p1k, p3b)",
    )
    parser.add_argument(
        "--sleep", type=float, default=2.0, metavar="S", help="P8: seconds each worker sleeps (default 2)"
    )
    parser.add_argument(
        "--p3b-timeout",
        type=float,
        default=P3B_TIMEOUT,
        metavar="S",
        help=f"P3b: a run still going after S seconds is killed and excluded (default {P3B_TIMEOUT:g})",
    )
    args = parser.parse_args(argv)
    if args.number != 1:
        parser.error("--number makes no sense here: every sample is one whole job")
    trees = ensure_bytecode()
    print(f"(compiled {trees} rallypoint source trees to bytecode first, as an installed wheel has them)")
    measures = {"p1": measure_p1, "p3": measure_p3, "p8": measure_p8, "p1w": measure_p1w, "p3b": measure_p3b}
    measures["p1k"] = measure_p1k
    units = {"p1": format_duration, "p3": format_duration, "p8": format_mib, "p1w": format_duration}
    units["p1k"] = units["p3b"] = format_duration
    results: dict[str, Comparison] = {}
    workdir = tempfile.mkdtemp(prefix="rp-bench-agent-")
    try:
        for name in args.only:
            results[name] = measures[name](args, workdir)
            print(flush=True)
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    if args.json:
        data = {"title": "agent", "measures": {n: c.as_dict() for n, c in results.items()}, "run": run_info()}
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    print("summary: median rallypoint / median torch")
    print(f"{'id':<4}  {'rallypoint':>11}  {'torch':>11}  {'ratio':>8}  target")
    for name, c in results.items():
        fmt = units[name]
        target = TARGETS[name]
        verdict = f"<= {target}x " + ("met" if c.ratio <= target else "MISSED")
        ratio = format_ratio(c.ratio) + "x"
        print(f"{_label(name):<4}  {fmt(c.a.median):>11}  {fmt(c.b.median):>11}  {ratio:>8}  {verdict}")
    first = next(iter(results))
    print(f"headline ({_label(first)}):")
    print(ratio_line(results[first]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
