"""The DDP example as a Slurm batch job on the namespace cluster (``slurm_cluster.py``).

The batch script is the one the "Running on Slurm" page shows: ``srun rallypoint run job.toml``,
one task per node, and no rendezvous flag: the agents take the nodes, the endpoint and the run
id from Slurm.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import slurm_cluster

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "ddp" / "train.py"
#: ``rallypoint`` of the environment running the tests.
RALLYPOINT = str(Path(sys.executable).parent / "rallypoint")


DOCS_PAGE = ROOT / "docs" / "slurm.md"


def documented_script() -> str:
    """The batch script of the "Running on Slurm" page (its first ``bash`` block)."""
    text = DOCS_PAGE.read_text()
    start = text.index("```bash\n", text.index("## The batch script")) + len("```bash\n")
    return text[start : text.index("```", start)]


def batch_script(nodes: int, job_file: Path, *, sbatch: Sequence[str] = (), log: Path) -> str:
    """The documented ``sbatch`` script, with this test's node count, paths and extra options."""
    script = documented_script()
    for line, replacement in [
        ("#SBATCH --nodes=3", f"#SBATCH --nodes={nodes}"),
        ("#SBATCH --output=slurm-%j.out", "\n".join([f"#SBATCH --output={log}", *(f"#SBATCH {o}" for o in sbatch)])),
        ("srun rallypoint run job.toml", f"srun {RALLYPOINT} run {job_file}"),
    ]:
        if line not in script:
            raise AssertionError(f"the script of {DOCS_PAGE} no longer has the line {line!r}")
        script = script.replace(line, replacement)
    return script


class SlurmDdpJob:
    """``examples/ddp/train.py`` on every node of an allocation, one worker per node.

    Args:
        cluster: the Slurm cluster.
        tmp_path: the test's directory (shared by every host): job file, output, logs.
        nodes: ``--nodes`` of the batch job.
        train: the training script's arguments besides ``--out``.
        job_keys: more job-file text (e.g. ``[nodes]\\nmin = 2``).
        agent_keys: more lines of the job file's ``[agent]`` section (e.g. ``preload = ["torch"]``).
        sbatch: more ``#SBATCH`` options.
    """

    def __init__(
        self,
        cluster: slurm_cluster.SlurmCluster,
        tmp_path: Path,
        *,
        nodes: int = 3,
        train: Sequence[str] = ("--steps", "30", "--global-batch", "12", "--ckpt-every", "5"),
        job_keys: str = "",
        agent_keys: str = "",
        sbatch: Sequence[str] = (),
    ) -> None:
        self.cluster = cluster
        self.tmp = tmp_path
        self.out = tmp_path / "out"
        self.log = tmp_path / "slurm-%j.out"
        args = ", ".join(json.dumps(a) for a in [*train, "--out", str(self.out)])
        self.job_file = tmp_path / "job.toml"
        self.job_file.write_text(
            f'[job]\nentrypoint = "{TRAIN}"\nargs = [{args}]\n\n'
            f'[agent]\nlog_dir = "{tmp_path}/logs/{{run_id}}"\nmonitor_interval = "100ms"\n{agent_keys}\n'
            '[rendezvous]\nlast_call_timeout = "500ms"\n' + (f"\n{job_keys}\n" if job_keys else "")
        )
        self.script = tmp_path / "job.sbatch"
        self.script.write_text(batch_script(nodes, self.job_file, sbatch=sbatch, log=self.log))
        self.job_id = 0
        self.submitted = 0.0

    def submit(self) -> int:
        self.submitted = time.time()
        self.job_id = self.cluster.sbatch(self.script, f"--chdir={self.tmp}")
        return self.job_id

    def output(self) -> str:
        path = self.tmp / f"slurm-{self.job_id}.out"
        return path.read_text(errors="replace") if path.exists() else "(no output yet)"

    def _lines(self, name: str) -> list[dict[str, Any]]:
        path = self.out / name
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]

    def progress(self) -> list[dict[str, Any]]:
        return self._lines("progress.jsonl")

    def starts(self) -> list[dict[str, Any]]:
        return self._lines("starts.jsonl")

    def wait_step(self, step: int, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = [p for p in self.progress() if p["step"] >= step]
            if done:
                return done[0]
            time.sleep(0.05)
        raise AssertionError(f"step {step} not reached in {timeout:g}s:\n{self.output()[-4000:]}")

    def wait_until_final(self, timeout: float = 90) -> None:
        """Wait until rank 0 wrote the final weights."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.out / "final.json").exists():
                return
            time.sleep(0.1)
        raise AssertionError(f"no final weights after {timeout:g}s:\n{self.output()[-4000:]}")

    def wait_end(self, timeout: float = 90) -> str:
        """Wait until the job ended; its final state (``COMPLETED``, ``FAILED``...)."""
        return self.cluster.wait_state(
            self.job_id, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED"], timeout=timeout
        )

    def requeued(self, restarts: int) -> None:
        """Wait until the job is pending again after its ``restarts``-th requeue, and start it now."""
        deadline = time.monotonic() + 60
        while self.cluster.job(self.job_id).get("Restarts") != str(restarts):
            if time.monotonic() > deadline:
                raise AssertionError(f"not requeued ({self.cluster.job(self.job_id)}):\n{self.output()[-4000:]}")
            time.sleep(0.1)
        self.cluster.wait_state(self.job_id, ["PENDING"], timeout=30)
        # a requeued job waits for its begin time (about two minutes); start it now, but only on
        # nodes done with the previous run, and not in the second it was killed: slurmd refuses a
        # job credential issued no later than (to the second) the revocation of the killed run's,
        # and the batch step then fails at once ("Job N already killed, do not launch batch job",
        # exit 1, no output: seen when the two fell in one second)
        self.wait_nodes_idle()
        time.sleep(2.0)
        self.cluster.client(["scontrol", "update", f"job={self.job_id}", "StartTime=now"])

    def resumed(self, restart: int, nodes: int = 3, timeout: float = 90) -> list[dict[str, Any]]:
        """The start records of the workers of the ``restart``-th run (``TORCHELASTIC_RESTART_COUNT``)."""
        deadline = time.monotonic() + timeout
        while len(starts := [s for s in self.starts() if s["restart"] == restart]) < nodes:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"run {restart} did not start ({self.cluster.job(self.job_id)}):\n{self.output()[-4000:]}\n"
                    f"{self.cluster.logs_tail(25)}"
                )
            time.sleep(0.1)
        return starts

    def assert_each_run_resumed_from_its_notice(
        self, runs: Sequence[list[dict[str, Any]]], signals: Sequence[str], logs: Path
    ) -> None:
        """Each requeued run's workers resumed from the checkpoint its notice wrote, all under one run id.

        ``runs[i]`` are the start records of the run after the ``i``-th notice, whose signal is
        ``signals[i]``; ``logs`` holds one log directory only, the job id's (a requeue is the same run).
        """
        notices = [json.loads(line) for line in (self.out / "preempted.jsonl").read_text().splitlines()]
        assert [n["signal"] for n in notices] == list(signals), notices
        for starts, notice in zip(runs, notices, strict=True):
            assert sorted(s["rank"] for s in starts) == [0, 1, 2], self.starts()
            assert {s["resumed"] for s in starts} == {notice["step"]}
        names = sorted(p.name for p in logs.iterdir())
        assert names == [f"slurm-{self.job_id}"], names

    def wait_nodes_idle(self, timeout: float = 30) -> None:
        """Wait until every compute node is idle: no job, and nothing of one left to finish."""
        idle = ["idle"] * len(self.cluster.nodes)
        deadline = time.monotonic() + timeout
        while (states := self.cluster.client(["sinfo", "-h", "-N", "-o", "%t"], check=False).stdout.split()) != idle:
            if time.monotonic() > deadline:
                raise AssertionError(f"the nodes are still {states} after {timeout:g} s")
            time.sleep(0.1)
