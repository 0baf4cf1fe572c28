"""From ``sbatch`` to the first training step on every node: rallypoint with no flags vs torchrun under srun.

Both sides submit the same kind of 3-node batch job to a real Slurm cluster (Debian's 22.05:
``slurmctld`` and one ``slurmd`` per compute host, on network-namespace hosts of this machine,
started by ``integration-tests/slurm_cluster.py``) whose tasks run a small DDP training script
over Gloo, ``--nproc-per-node`` workers per node:

* A rallypoint: ``srun rallypoint run job.toml``; the job file names the script and the workers
  per node, nothing about the rendezvous (the Slurm launch environment fills it in).
* B torch: the usual recipe, ``head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)``
  then ``srun torchrun --nnodes 3 --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint
  $head:29500 --rdzv-id $SLURM_JOB_ID train.py``. The hosts' names resolve to 127.0.0.1 on their
  own host (as on many cloud images), so torchrun needs what its users on such clusters add: its
  workers' ``MASTER_ADDR`` would be ``localhost`` (the first node's fully qualified name) and
  Gloo would bind to loopback, so each task passes ``--local-addr`` its host's address (``hostname
  -I``) and ``GLOO_SOCKET_IFNAME=eth0`` is exported. rallypoint finds both by itself.

A sample is the time from just before ``sbatch`` runs to the moment the last worker finished its
first training step (DDP's construction, one forward, backward and optimizer step), read from
the timestamp file each worker writes: every namespace host shares this machine's clock. The
benchmark then waits (untimed) for the job to complete and its nodes to be idle again before the
next submission. Sides alternate and flip order each round; medians are compared. Target <= 0.6x.

Where the time goes (reported per side, medians over the rounds, each phase up to the last node
or worker to reach it): Slurm's scheduling and batch start (``sbatch`` to the first line of the
batch script), the job step's launch (to the last ``srun`` task started; both sides' task is
wrapped in ``sh -c`` that writes the time and ``exec``\\s the launcher), the launcher (agent start,
rendezvous and worker spawn: to the last worker's first line), ``import torch``, the process
group (``init_process_group("gloo")``), and the first step.

``--preload torch,torch._dynamo`` adds ``[agent] preload = [...]`` to rallypoint's job file (still
no flag): one warm process per node imports them while the rendezvous runs and forks the workers
(DDP's constructor imports ``torch._dynamo``, and with it sympy: seconds on a loaded machine).

Needs root and the Slurm packages (``apt-get install -y slurmctld slurmd slurm-client munge``).
Each sample is a whole cluster job, so ``--smoke`` runs one round and no warm-up.

    .venv/bin/python tools/bench/slurm_launch.py --rounds 5      # the measurement
    .venv/bin/python tools/bench/slurm_launch.py --smoke         # CI: one job per side
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import (
    BenchmarkError,
    Comparison,
    bench_parser,
    compare,
    ensure_bytecode,
    find_executable,
    format_duration,
    format_report,
    run_info,
    settings_from_args,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "integration-tests"))

LABELS = ("rallypoint", "torch")
TARGET = 0.6
#: Seconds one job may take from submission to its end before the benchmark fails.
JOB_TIMEOUT = 300.0
TORCH_PORT = 29500
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
#: Seconds a job may run on after every worker stepped before it is cancelled (the sample stands).
AFTER_STEP = 60.0

#: The training script of both sides: timestamps of its phases, one JSON file per rank.
TRAIN = """\
import time

started = time.time()
import json
import os
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

imported = time.time()
dist.init_process_group("gloo")
grouped = time.time()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
optim = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8)
loss = model(x).pow(2).mean()
loss.backward()
optim.step()
stepped = time.time()
rank = int(os.environ["RANK"])
record = {"rank": rank, "world": dist.get_world_size(), "host": socket.gethostname(),
          "started": started, "imported": imported, "grouped": grouped, "stepped": stepped}
out = os.environ["BENCH_OUT"]
with open(os.path.join(out, f".rank{rank}.tmp"), "w") as f:
    json.dump(record, f)
os.rename(os.path.join(out, f".rank{rank}.tmp"), os.path.join(out, f"rank{rank}.json"))
dist.destroy_process_group()
"""

#: The first command of both sides' task on each node: note when it started, before the launcher.
STAMP = 'echo "$(date +%s.%N)" > "$BENCH_OUT/task-$SLURM_NODEID";'

#: Phases of the breakdown: (name, the timestamp that ends it); each starts where the one before ended.
PHASES = (
    ("Slurm: sbatch to batch script", "batch"),
    ("Slurm: job step launched on every node", "task"),
    ("launcher: agent, rendezvous, workers spawned", "started"),
    ("import torch", "imported"),
    ("init_process_group (gloo)", "grouped"),
    ("first step (DDP, forward, backward, optimizer)", "stepped"),
)


def batch_scripts(workdir: Path, nodes: int, nproc: int, *, preload: Sequence[str] = ()) -> dict[str, Path]:
    """Write the training script, the job file and both sides' batch scripts; their paths by side."""
    train = workdir / "train.py"
    train.write_text(TRAIN)
    job = workdir / "job.toml"
    warm = f"\n[agent]\npreload = {json.dumps(list(preload))}\n" if preload else ""
    job.write_text(f'[job]\nentrypoint = "{train}"\n\n[nodes]\nnproc_per_node = {nproc}\n{warm}')
    head = [
        "#!/bin/bash",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={workdir}/slurm-%j.out",
        'echo "$(date +%s.%N)" > "$BENCH_OUT/batch"',
    ]
    stamp_then_exec = shlex.quote(STAMP + ' exec "$@"')
    ours = [*head, f"srun sh -c {stamp_then_exec} sh {find_executable('rallypoint')} run {job}"]
    torchrun = (
        f"exec {find_executable('torchrun')} --nnodes {nodes} --nproc-per-node {nproc} "
        '--local-addr "$(hostname -I | cut -d" " -f1)" '
        f'--rdzv-backend c10d --rdzv-endpoint "$head:{TORCH_PORT}" --rdzv-id "$SLURM_JOB_ID" {train}'
    )
    theirs = [
        *head,
        "export GLOO_SOCKET_IFNAME=eth0",
        'export head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f"srun sh -c {shlex.quote(STAMP + ' ' + torchrun)}",
    ]
    paths = {}
    for label, lines in zip(LABELS, (ours, theirs), strict=True):
        paths[label] = workdir / f"{label}.sbatch"
        paths[label].write_text("\n".join(lines) + "\n")
    return paths


class SlurmSide:
    """One side: each call submits its batch job and measures sbatch to the last worker's first step.

    Calling it advances ``clock`` by the measured seconds (so :func:`compare` records them) and
    keeps each sample's phase timestamps for the breakdown.
    """

    def __init__(self, label: str, cluster: Any, script: Path, workdir: Path, workers: int, clock: Any) -> None:
        self.label = label
        self.cluster = cluster
        self.script = script
        self.workdir = workdir
        self.workers = workers
        self.nodes = len(cluster.nodes)
        self.clock = clock
        self.runs = 0
        self.phases: list[dict[str, float]] = []
        #: Jobs that ended other than COMPLETED after every worker had stepped (measured all the same).
        self.failed: list[str] = []

    def __call__(self) -> None:
        self.clock.now += self.run_once()

    def run_once(self) -> float:
        self.runs += 1
        out = self.workdir / f"{self.label}-{self.runs}"
        out.mkdir()
        submitted = time.time()
        job_id = self.cluster.sbatch(self.script, f"--chdir={self.workdir}", env={"BENCH_OUT": str(out)})
        (out / "submitted").write_text(f"{submitted}\n")
        records = self._records(out, job_id)
        state = self._wait_end(job_id, AFTER_STEP)
        if state not in ENDED:  # stepped, then hung (torchrun's agents, a Gloo teardown): the sample stands
            self.cluster.client(["scancel", str(job_id)], check=False)
            state = f"still {state or 'unknown'} {AFTER_STEP:g} s after every worker's first step, cancelled"
            self._wait_end(job_id, JOB_TIMEOUT)
        if state != "COMPLETED":  # after every worker's first step: the sample stands, the failure is reported
            lines = [line for line in self._output(job_id).splitlines() if "Error" in line or "error" in line]
            self.failed.append(f"job {job_id} {state}: {lines[0] if lines else '(no error line)'}")
        self._wait_idle()
        stamps = {
            "submitted": submitted,
            "batch": float((out / "batch").read_text()),
            "task": max(float((out / f"task-{n}").read_text()) for n in range(self.nodes)),
        }
        for key in ("started", "imported", "grouped", "stepped"):
            stamps[key] = max(r[key] for r in records)
        self.phases.append(stamps)
        return stamps["stepped"] - submitted

    def _records(self, out: Path, job_id: int) -> list[dict[str, Any]]:
        """Every worker's timestamps, once all have stepped (the job failing first is an error)."""
        deadline = time.monotonic() + JOB_TIMEOUT
        asked = time.monotonic()
        while len(files := sorted(out.glob("rank*.json"))) < self.workers:
            if time.monotonic() > deadline:
                raise BenchmarkError(f"{self.label}'s workers did not all step in {JOB_TIMEOUT:g} s")
            if time.monotonic() - asked > 1.0:  # the job's state once a second: scontrol costs CPU
                asked = time.monotonic()
                state = self._state(job_id)
                if state in ENDED and len(list(out.glob("rank*.json"))) < self.workers:
                    raise BenchmarkError(f"{self.label}'s job {job_id} ended {state}:\n{self._output(job_id)}")
            time.sleep(0.05)
        records = [json.loads(p.read_text()) for p in files]
        worlds = {r["world"] for r in records}
        hosts = {r["host"] for r in records}
        if worlds != {self.workers} or len(hosts) != self.nodes:
            raise BenchmarkError(f"{self.label}: world sizes {worlds}, hosts {hosts}: not one job on every node")
        return records

    def _state(self, job_id: int) -> str:
        """The job's state; ``""`` when the controller did not answer in time (a loaded machine: asked again)."""
        try:
            return self.cluster.job(job_id).get("JobState", "")
        except subprocess.TimeoutExpired:
            return ""

    def _wait_end(self, job_id: int, timeout: float) -> str:
        """The job's state once it ended, or its last state after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (state := self._state(job_id)) not in ENDED and time.monotonic() < deadline:
            time.sleep(0.2)
        return state

    def _wait_idle(self, timeout: float = 60) -> None:
        """Wait until every node is idle again (untimed): the next job then starts as this one did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                out = self.cluster.client(["sinfo", "-h", "-N", "-o", "%t"], check=False)
            except subprocess.TimeoutExpired:
                continue
            if out.returncode == 0 and set(out.stdout.split()) == {"idle"}:
                return
            time.sleep(0.1)
        raise BenchmarkError(f"the nodes were not idle {timeout:g} s after {self.label}'s job")

    def _output(self, job_id: int) -> str:
        path = self.workdir / f"slurm-{job_id}.out"
        text = path.read_text(errors="replace") if path.exists() else "(no output)"
        return "\n".join(text.splitlines()[-30:])


class VirtualClock:
    """A clock for :func:`compare` that moves only by what a side measured."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def breakdown(sides: Sequence[SlurmSide]) -> list[str]:
    """Median seconds of each phase per side, each from the end of the phase before."""
    width = max(len(name) for name, _ in PHASES)
    lines = [
        "where the time goes: median per phase, each up to the last node or worker to reach it",
        f"  {'phase':<{width}}  " + "  ".join(f"{s.label:>11}" for s in sides),
    ]
    previous = "submitted"
    for name, key in PHASES:
        cells = [statistics.median(p[key] - p[previous] for p in s.phases) for s in sides]
        lines.append(f"  {name:<{width}}  " + "  ".join(f"{format_duration(c):>11}" for c in cells))
        previous = key
    totals = [statistics.median(p["stepped"] - p["submitted"] for p in s.phases) for s in sides]
    cells = "  ".join(f"{format_duration(t):>11}" for t in totals)
    lines.append(f"  {'total (sbatch to the first step)':<{width}}  {cells}")
    return lines


def measure(args: argparse.Namespace, cluster: Any, workdir: Path) -> tuple[Comparison, list[SlurmSide]]:
    """Both sides, alternating, with the command line's settings."""
    scripts = batch_scripts(workdir, args.nodes, args.nproc_per_node, preload=args.preload)
    clock = VirtualClock()
    workers = args.nodes * args.nproc_per_node
    sides = [SlurmSide(label, cluster, scripts[label], workdir, workers, clock) for label in LABELS]
    settings = {"rounds": 1, "warmup": 0} if args.smoke else settings_from_args(args)
    progress = None
    if args.verbose:

        def progress(i: int, label: str, seconds: float) -> None:
            print(f"round {i}: {label} {format_duration(seconds)}", file=sys.stderr, flush=True)

    comparison = compare(
        sides[0], sides[1], labels=LABELS, clock=clock, progress=progress,
        rounds=settings["rounds"], warmup=settings["warmup"],
    )  # fmt: skip
    # the warm-up's phases are not part of the breakdown
    for side in sides:
        side.phases = side.phases[settings["warmup"] :]
    return comparison, sides


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=5, warmup=1)
    parser.add_argument("--nodes", type=int, default=3, help="compute hosts, and nodes of each job (default 3)")
    parser.add_argument("--nproc-per-node", type=int, default=1, metavar="N", help="workers per node (default 1)")
    parser.add_argument(
        "--preload",
        type=lambda text: [m for m in text.split(",") if m],
        default=[],
        metavar="MODULES",
        help="rallypoint's job file also says [agent] preload = MODULES (comma-separated; warm workers; "
        "still no flag), e.g. torch,torch._dynamo",
    )
    args = parser.parse_args(argv)
    if args.number != 1:
        parser.error("--number makes no sense here: every sample is one whole Slurm job")
    if args.nodes < 1 or args.nproc_per_node < 1:
        parser.error("--nodes and --nproc-per-node must be at least 1")
    import netns
    import slurm_cluster

    ensure_bytecode()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # tear the cluster down as on Ctrl-C
    workdir = Path(tempfile.mkdtemp(prefix="rp-bench-slurm-"))
    try:
        with slurm_cluster.slurm_cluster(args.nodes) as cluster:
            comparison, sides = measure(args, cluster, workdir)
    except (slurm_cluster.SlurmUnavailable, netns.NetnsUnavailable) as exc:
        print(f"error: cannot start the Slurm cluster: {exc}", file=sys.stderr)
        return 2
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    title = f"slurm_launch: sbatch to the first training step on every node of a {args.nodes}-node job"
    details = [
        f"A rallypoint: srun rallypoint run job.toml (no rendezvous flag; {args.nproc_per_node} worker(s) per node"
        + (f", [agent] preload = {args.preload})" if args.preload else ")"),
        f"B torch:      srun torchrun --nnodes {args.nodes} --nproc-per-node {args.nproc_per_node} --local-addr ADDR "
        f"--rdzv-backend c10d --rdzv-endpoint $head:{TORCH_PORT} --rdzv-id $SLURM_JOB_ID train.py "
        "(GLOO_SOCKET_IFNAME=eth0)",
        *breakdown(sides),
        *(
            f"{s.label}: {len(s.failed)} of {s.runs} job(s) (warm-up included) did not complete after every "
            f"worker's first step (their samples stand): {s.failed[0]}"
            for s in sides
            if s.failed
        ),
        f"target <= {TARGET}x: " + ("met" if comparison.ratio <= TARGET else "MISSED"),
    ]
    if args.json:
        phases = {s.label: s.phases for s in sides}
        failed = {s.label: s.failed for s in sides}
        data = {"title": title, "details": details, **comparison.as_dict(), "phases": phases, "failed": failed}
        data["run"] = run_info()
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    print(format_report(comparison, title=title, details=details), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
