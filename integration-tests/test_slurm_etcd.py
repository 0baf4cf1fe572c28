"""A Slurm job whose job file names an etcd rendezvous, requeued twice: the same run each time.

With the default agent-hosted gRPC rendezvous the job's state ends with the agents; with etcd it
outlives them, so a requeued job (same job id, so same run id) meets what the previous run left
there: its rounds, its restart count, and whether it was closed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from etcd_server import start_etcd
from slurm_jobs import SlurmDdpJob


def test_an_etcd_job_requeued_after_each_notice_resumes_under_the_same_run_id(slurm: Any, tmp_path: Path) -> None:
    began = time.monotonic()
    cluster = slurm(3)
    start_etcd(cluster.controller, tmp_path / "etcd-data")  # on the controller host, reached by every node
    endpoint = f"{cluster.controller.addr}:2379"
    train = ("--steps", "60", "--ckpt-every", "1000", "--step-time", "0.1", "--checkpoint-on-preemption")
    keys = f'[rendezvous.options]\nendpoints = ["{endpoint}"]\nconnect_timeout = 5\n'
    job = SlurmDdpJob(cluster, tmp_path, train=train, job_keys=keys, sbatch=["--requeue", "--open-mode=append"])
    job.job_file.write_text(job.job_file.read_text().replace("[rendezvous]\n", '[rendezvous]\nbackend = "etcd"\n'))
    job.submit()
    job.wait_step(8, timeout=120)
    cluster.client(["scancel", "--signal=USR2", str(job.job_id)])  # the time limit's warning
    job.requeued(1)  # by the batch script, on the agents' exit code 75
    first = job.resumed(1)
    job.wait_step(first[0]["resumed"] + 8)
    cluster.client(["scontrol", "requeue", str(job.job_id)])  # SIGTERM: the agents stop, and exit 75
    job.requeued(2)
    second = job.resumed(2)
    state = job.wait_end(timeout=120)
    out = job.output()
    assert state == "COMPLETED", out[-4000:]
    assert "a finished run cannot be joined again" not in out, out[-4000:]
    job.assert_each_run_resumed_from_its_notice([first, second], ["SIGUSR2", "SIGTERM"], tmp_path / "logs")
    assert job.progress()[-1]["step"] == 60
    assert out.count(f"job 'slurm-{job.job_id}' succeeded") == 3, out[-3000:]  # the last run only
    rounds = {r: sorted({s["round"] for s in job.starts() if s["restart"] == r}) for r in (0, 1, 2)}
    # the warning's run closed the job and its last agent removed the keys: the next run starts afresh
    assert rounds[1] == [0], rounds
    print(f"etcd requeue test: {time.monotonic() - began:.1f} s; rounds of each run: {rounds}")
