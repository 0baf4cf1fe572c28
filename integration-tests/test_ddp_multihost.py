"""A real DDP training (``examples/ddp/train.py``) on 2 namespace hosts x 2 workers.

Its final weights equal those of one plain process training on the same global batch (to
1e-5), without and with a worker crash in the middle (the job restarts within its budget and
resumes from its last checkpoint). The crash's figures go to ``results.json``.
"""

from __future__ import annotations

from pathlib import Path

from ddp_jobs import DdpJob, assert_same_weights, last_step_before, record


def test_two_hosts_two_workers_equal_one_process(hosts, tmp_path: Path, ddp_reference: list[float]) -> None:
    net = hosts(2)
    job = DdpJob(net, tmp_path, nproc=2, train=("--steps", "40", "--global-batch", "12", "--ckpt-every", "5"))
    job.start_all()
    job.assert_succeeded()
    assert_same_weights(job.final_weights(), ddp_reference)
    starts = job.starts()
    assert len(starts) == 4
    assert {s["host"] for s in starts} == {"nodea", "nodeb"}
    assert {s["world"] for s in starts} == {4}


def test_a_worker_crash_restarts_within_budget_with_the_same_weights(
    hosts, tmp_path: Path, ddp_reference: list[float]
) -> None:
    net = hosts(2)
    # global rank 3 (nodeb's second worker) exits 1 at step 22, once; checkpoints every 5 steps
    train = ("--steps", "40", "--global-batch", "12", "--ckpt-every", "5", "--step-time", "0.1")
    job = DdpJob(net, tmp_path, nproc=2, max_restarts=1, train=(*train, "--crash-at-step", "22", "--crash-rank", "3"))
    job.start_all()
    job.wait_until(lambda: (tmp_path / "out" / "crashed").exists(), "the injected crash")
    crashed_at = (tmp_path / "out" / "crashed").stat().st_mtime
    job.assert_succeeded()
    worst = assert_same_weights(job.final_weights(), ddp_reference)
    restarted = [s for s in job.starts() if s["restart"] == 1]
    assert len(restarted) == 4
    assert {s["resumed"] for s in restarted} == {20}
    assert sum("restarting the job (1 of 1 restart(s) used)" in a.output() for a in job.agents) == 1
    figures = job.figures(crashed_at, last_step_before(job, crashed_at), job.agents)
    assert figures["steps_lost"] == 22 - 20
    assert figures["world_after"] == 4
    record("worker crash (2 hosts x 2 workers, restart 1 of 1)", {**figures, "weights_max_diff": worst})
