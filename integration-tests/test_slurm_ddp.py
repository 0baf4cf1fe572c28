"""The DDP example as a Slurm batch job: ``srun rallypoint run job.toml``, no rendezvous flag."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import netns
import torch
from slurm_jobs import SlurmDdpJob


def test_sbatch_three_node_ddp_with_no_flags(slurm: Any, tmp_path: Path) -> None:
    cluster = slurm(3)
    job = SlurmDdpJob(cluster, tmp_path, nodes=3)
    job.submit()
    state = job.wait_end(timeout=90)
    assert state == "COMPLETED", job.output()[-4000:]
    starts = job.starts()
    assert sorted(s["rank"] for s in starts) == [0, 1, 2], starts
    assert {s["world"] for s in starts} == {3}
    assert {s["host"] for s in starts} == {"node1", "node2", "node3"}
    assert (job.out / "final.json").exists()
    assert job.progress()[-1]["step"] == 30


def _job_processes(cluster: Any) -> dict[str, list[str]]:
    """Every process on the compute hosts besides slurmd (and the shells that started it)."""
    found: dict[str, list[str]] = {}
    for node in cluster.nodes:
        for pid in node.pids():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except FileNotFoundError:
                continue
            if cmdline and "slurmd -D" not in cmdline and netns.process_alive(pid):
                found.setdefault(node.name, []).append(f"{pid} {cmdline[:120]}")
    return found


def test_scancel_mid_run_leaves_nothing_within_5_s(slurm: Any, tmp_path: Path) -> None:
    cluster = slurm(3)
    train = ("--steps", "400", "--ckpt-every", "1000", "--step-time", "0.1", "--checkpoint-on-preemption")
    job = SlurmDdpJob(cluster, tmp_path, nodes=3, train=train)
    job.submit()
    job.wait_step(8)
    running = _job_processes(cluster)
    assert set(running) == {"node1", "node2", "node3"}, running
    assert all(len(procs) >= 3 for procs in running.values()), running  # srun's step, agent, worker at least
    cancelled = time.monotonic()
    cluster.client(["scancel", str(job.job_id)])
    left = running
    while time.monotonic() - cancelled < 5 and left:
        time.sleep(0.1)
        left = _job_processes(cluster)
    assert not left, f"still running {time.monotonic() - cancelled:.1f} s after scancel: {left}"
    # no periodic checkpoint in 1000 steps: the only one is the one written on the notice, and it is whole
    notices = [json.loads(line) for line in (job.out / "preempted.jsonl").read_text().splitlines()]
    assert [n["signal"] for n in notices] == ["SIGTERM"], notices
    ckpts = list((job.out / "ckpt").glob("step_*.pt"))
    assert [p.name for p in ckpts] == [f"step_{notices[0]['step']}.pt"]
    state = torch.load(ckpts[0], weights_only=True)
    assert state["step"] == notices[0]["step"] >= 8
    assert set(state) == {"step", "model", "optim"}
    assert not list((job.out / "ckpt").glob(".step_*"))  # no half-written one left behind


def test_a_requeued_job_resumes_from_the_notice_checkpoint_under_the_same_run_id(slurm: Any, tmp_path: Path) -> None:
    cluster = slurm(3)
    train = ("--steps", "60", "--ckpt-every", "1000", "--step-time", "0.1", "--checkpoint-on-preemption")
    job = SlurmDdpJob(cluster, tmp_path, nodes=3, train=train, sbatch=["--requeue"])
    job.submit()
    job.wait_step(8)
    cluster.client(["scontrol", "requeue", str(job.job_id)])
    cluster.wait_state(job.job_id, ["PENDING"], timeout=30)
    # a requeued job waits for its begin time (about two minutes); start it now
    cluster.client(["scontrol", "update", f"job={job.job_id}", "StartTime=now"])
    state = job.wait_end(timeout=90)
    assert state == "COMPLETED", job.output()[-4000:]
    assert cluster.job(job.job_id).get("Restarts") == "1"
    notices = [json.loads(line) for line in (job.out / "preempted.jsonl").read_text().splitlines()]
    assert len(notices) == 1, notices
    resumed = [s for s in job.starts() if s["resumed"] > 0]
    assert sorted(s["rank"] for s in resumed) == [0, 1, 2], job.starts()
    assert {s["resumed"] for s in resumed} == {notices[0]["step"]}
    assert job.progress()[-1]["step"] == 60
    # both runs ran under the run id of the job id: the requeued job is the same run
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == [f"slurm-{job.job_id}"], logs
    assert job.output().count(f"job 'slurm-{job.job_id}' succeeded") == 3, job.output()[-3000:]


def test_a_compute_host_killed_mid_job_elastic_survivors_finish(slurm: Any, tmp_path: Path) -> None:
    cluster = slurm(3)
    train = ("--steps", "40", "--ckpt-every", "5", "--step-time", "0.1")
    keys = '[nodes]\nmin = 2\n\n[rendezvous]\nheartbeat_interval = "1s"\nheartbeat_timeout = "4s"\n'
    job = SlurmDdpJob(cluster, tmp_path, nodes=3, train=train, job_keys=keys)
    job.job_file.write_text(job.job_file.read_text().replace('[rendezvous]\nlast_call_timeout = "500ms"\n', ""))
    job.submit()
    job.wait_step(8)
    node3 = cluster.nodes[2]
    cluster.network.kill(node3)  # every process of node3 at once, slurmd included: the host lost power
    job.wait_until_final(timeout=90)
    after = [p for p in job.progress() if p["world"] == 2]
    assert after, job.output()[-4000:]
    assert job.progress()[-1]["step"] == 40
    assert {s["host"] for s in job.starts() if s["world"] == 2} == {"node1", "node2"}
    succeeded = f"job 'slurm-{job.job_id}' succeeded"
    deadline = time.monotonic() + 30
    while job.output().count(succeeded) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job.output().count(succeeded) == 2, job.output()[-4000:]
