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


def _scancel_and_wait_gone(cluster: Any, job_id: int, running: dict[str, list[str]]) -> None:
    """``scancel`` the job; every process of it (``running``) is gone from the hosts within 5 s."""
    cancelled = time.monotonic()
    cluster.client(["scancel", str(job_id)])
    left = running
    while time.monotonic() - cancelled < 5 and left:
        time.sleep(0.1)
        left = _job_processes(cluster)
    assert not left, f"still running {time.monotonic() - cancelled:.1f} s after scancel: {left}"


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
    """A plain ``scancel``: every process of the job is gone from every host within 5 s.

    No checkpoint is asserted here: ``scancel`` also signals the batch step, and ``srun`` answers
    its own SIGTERM by killing its tasks at once ("srun: forcing job termination"), so the
    workers' notice checkpoint races that SIGKILL (the test below gives the notice with
    ``scancel --signal=TERM``, which leaves the batch step alone). What may not happen is a
    half-written checkpoint: one is whole or absent.
    """
    cluster = slurm(3)
    train = ("--steps", "400", "--ckpt-every", "1000", "--step-time", "0.1", "--checkpoint-on-preemption")
    job = SlurmDdpJob(cluster, tmp_path, nodes=3, train=train)
    job.submit()
    job.wait_step(8)
    running = _job_processes(cluster)
    assert set(running) == {"node1", "node2", "node3"}, running
    assert all(len(procs) >= 3 for procs in running.values()), running  # srun's step, agent, worker at least
    _scancel_and_wait_gone(cluster, job.job_id, running)
    for ckpt in (job.out / "ckpt").glob("step_*.pt"):
        assert set(torch.load(ckpt, weights_only=True)) == {"step", "model", "optim"}
    assert not list((job.out / "ckpt").glob(".step_*"))  # no half-written one left behind


def test_a_sigterm_notice_checkpoints_once_and_every_agent_exits_75(slurm: Any, tmp_path: Path) -> None:
    """``scancel --signal=TERM``: the job's steps get the notice (not the batch step and its srun).

    Every worker stops after the same step, rank 0 writes one whole checkpoint and the record,
    and every agent exits 75 (requeue to resume); nothing of the job is left within 5 s after.
    """
    cluster = slurm(3)
    train = ("--steps", "400", "--ckpt-every", "1000", "--step-time", "0.1", "--checkpoint-on-preemption")
    job = SlurmDdpJob(cluster, tmp_path, nodes=3, train=train)
    job.submit()
    job.wait_step(8)
    cluster.client(["scancel", "--signal=TERM", str(job.job_id)])
    deadline = time.monotonic() + 60  # the documented batch script requeues the job on the agents' exit 75
    while cluster.job(job.job_id).get("Restarts") != "1":
        assert time.monotonic() < deadline, f"not requeued ({cluster.job(job.job_id)}):\n{job.output()[-4000:]}"
        time.sleep(0.1)
    out = job.output()
    assert out.count("stopped on a preemption notice (SIGTERM): exit 75") == 3, out[-4000:]
    assert "forcing job termination" not in out, out[-4000:]
    gone = time.monotonic()
    while (left := _job_processes(cluster)) and time.monotonic() - gone < 5:
        time.sleep(0.1)
    assert not left, left
    cluster.client(["scancel", str(job.job_id)])  # the requeued run is not started
    # no periodic checkpoint in 1000 steps: the only one is the one written on the notice, and it is whole
    notices = [json.loads(line) for line in (job.out / "preempted.jsonl").read_text().splitlines()]
    assert [n["signal"] for n in notices] == ["SIGTERM"], notices
    ckpts = list((job.out / "ckpt").glob("step_*.pt"))
    assert [p.name for p in ckpts] == [f"step_{notices[0]['step']}.pt"]
    state_dict = torch.load(ckpts[0], weights_only=True)
    assert state_dict["step"] == notices[0]["step"] >= 8
    assert set(state_dict) == {"step", "model", "optim"}
    assert not list((job.out / "ckpt").glob(".step_*"))


def test_with_torch_preloaded_the_store_is_served_before_the_workers_and_scancel_leaves_nothing(
    slurm: Any, tmp_path: Path
) -> None:
    """``[agent] preload = ["torch"]``: a fork of one node's warm process serves the workers' store (#39).

    The job trains as usual; the store's process runs beside the workers until ``scancel``, and
    is gone with everything else within 5 s.
    """
    cluster = slurm(3)
    train = ("--steps", "400", "--ckpt-every", "1000", "--step-time", "0.1")
    job = SlurmDdpJob(cluster, tmp_path, nodes=3, train=train, agent_keys='preload = ["torch"]')
    job.submit()
    job.wait_step(8)
    logs = list(tmp_path.glob("logs/*/attempt_0/store.log"))
    assert len(logs) == 1, logs  # written by the node of worker rank 0 alone
    # (torch's server may warn there too: a client's host name has no reverse lookup on these hosts)
    assert "serving torch's env:// store on " in logs[0].read_text(), logs[0].read_text()
    running = _job_processes(cluster)
    # forks of the warm process keep its command line: one warm process and one worker per node, and the store
    forks = [p for procs in running.values() for p in procs if "/warm/_server.py" in p]
    assert len(forks) == 3 + 3 + 1, running
    _scancel_and_wait_gone(cluster, job.job_id, running)


def test_a_requeued_job_resumes_from_the_notice_checkpoint_under_the_same_run_id(slurm: Any, tmp_path: Path) -> None:
    """The warning (USR2): workers checkpoint, agents exit 75, the documented script requeues; then a SIGTERM notice."""
    cluster = slurm(3)
    train = ("--steps", "80", "--ckpt-every", "1000", "--step-time", "0.1", "--checkpoint-on-preemption")
    job = SlurmDdpJob(cluster, tmp_path, nodes=3, train=train, sbatch=["--requeue", "--open-mode=append"])
    job.submit()
    job.wait_step(8)
    # as --signal=USR2@90 does before a time limit: every process of the job step (not the batch script)
    cluster.client(["scancel", "--signal=USR2", str(job.job_id)])
    job.requeued(1)  # by the batch script, on the agents' exit code 75
    first = job.resumed(1)
    job.wait_step(first[0]["resumed"] + 8)
    # SIGTERM to the job's steps: the agents stop and exit 75, the batch script requeues. (scontrol requeue
    # signals the batch step too, and srun answers its SIGTERM by killing its tasks: the checkpoint would race it)
    cluster.client(["scancel", "--signal=TERM", str(job.job_id)])
    job.requeued(2)
    second = job.resumed(2)
    state = job.wait_end(timeout=120)
    assert state == "COMPLETED", job.output()[-4000:]
    # every worker of each requeued run resumed from the checkpoint its notice wrote; all three runs ran
    # under the run id of the job id: a requeued job is the same run
    job.assert_each_run_resumed_from_its_notice([first, second], ["SIGUSR2", "SIGTERM"], tmp_path / "logs")
    assert job.progress()[-1]["step"] == 80
    out = job.output()
    assert out.count("the workers ended after a preemption notice (SIGUSR2), before the job's end: exit 75") == 3, out
    assert out.count("stopped on a preemption notice (SIGTERM): exit 75") == 3, out[-4000:]
    assert out.count(f"job 'slurm-{job.job_id}' succeeded") == 3, out[-3000:]  # the last run only


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


def test_a_compute_host_killed_mid_job_fixed_size_one_report_names_it(slurm: Any, tmp_path: Path) -> None:
    """Slurm's 3 nodes, all needed: the survivors exit 1 at once, each with the one report naming node3."""
    cluster = slurm(3)
    train = ("--steps", "400", "--ckpt-every", "5", "--step-time", "0.1")
    keys = '[rendezvous]\nheartbeat_interval = "1s"\nheartbeat_timeout = "4s"\n'
    job = SlurmDdpJob(cluster, tmp_path, nodes=3, train=train, job_keys=keys)
    job.job_file.write_text(job.job_file.read_text().replace('[rendezvous]\nlast_call_timeout = "500ms"\n', ""))
    job.submit()
    job.wait_step(8, timeout=120)  # torch imports on three hosts at once: slow on a loaded machine
    cluster.network.kill(cluster.nodes[2])  # node3 lost power: its agent, worker and slurmd at once
    killed = time.monotonic()
    # the survivors' agents end before Slurm itself gives up on the node (SlurmdTimeout, 30 s here; it then
    # cancels the job for the node failure, and requeues it: that is Slurm's, whatever the agents said)
    ended = [f"srun: error: {n}: task {i}: Exited with exit code 1" for i, n in enumerate(["node1", "node2"])]
    while not all(line in job.output() for line in ended):
        assert time.monotonic() - killed < 30, job.output()[-4000:]
        time.sleep(0.2)
    out = job.output()
    failed = f"job 'slurm-{job.job_id}' failed after 0 of 3 restart(s)"
    assert out.count(failed) == 2, out[-4000:]  # one report on each survivor
    assert out.count("root cause (first failure of the last attempt):") == 2, out[-4000:]
    lost = "on node3: host node3 was lost (node 'node3' stopped heart-beating); 2 node(s) are left, the job needs 3"
    assert out.count(lost) >= 2, out[-4000:]
    assert "restarting the job" not in out
    (saved,) = (tmp_path / "logs").glob("*/failure.json")
    report = json.loads(saved.read_text())
    assert report["root_cause"]["host"] == "node3", report
