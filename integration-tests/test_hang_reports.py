"""Hang reports the agents make on their own (issue #40): ``[debug] hang_timeout`` and CollectiveTimeout.

The jobs run ``hang_scripts/hang.py`` (a plain torch.distributed script) on three namespace hosts,
one worker each: rank 1 misbehaves after three all_reduce calls, the others wait in the fourth.

* With ``[debug] hang_timeout``, no rank's flight record moves, so after the timeout one agent
  gathers the report from every host, fails the attempt, and every node's failure report carries
  the diagnosis. A job that calls all_reduce once a second, with the same timeout, runs to its end.
* Through the rallypoint facade, the waiting ranks raise CollectiveTimeout; before they do, their
  agents gather the same report, and the failures carry the diagnosis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hung_jobs import HungJob, line_of

#: A loaded machine: heartbeats must not be what ends these jobs.
SLOW_MACHINE = ("--set", "rendezvous.heartbeat_timeout=60s")


@pytest.fixture
def jobs() -> Iterator[list[HungJob]]:
    made: list[HungJob] = []
    yield made
    for job in made:
        job.stop()


def rank1_host(job: HungJob, hosts: list) -> str:
    """The host whose agent runs rank 1 (ranks follow the order the nodes joined in)."""
    return next(h.name for h, o in zip(hosts, job.outs, strict=True) if "runs ranks [1]" in o.read_text())


@pytest.mark.parametrize(
    ("mode", "frame"),
    [
        ("python_sleep", f"never entered it: wait_for_batch_python at hang.py:{line_of('sum(range(1000))')}"),
        ("socket", f"never entered it: read_from_socket at hang.py:{line_of('return a.recv(1)')} [S in the kernel: "),
    ],
)
def test_no_progress_for_hang_timeout_fails_the_job_with_the_report_on_every_node(
    mode: str, frame: str, hosts, tmp_path: Path, jobs: list[HungJob]
) -> None:
    net = hosts(3)
    job = HungJob(tmp_path, mode, nproc=1, hosts=net.hosts, extra=("--set", "debug.hang_timeout=3s", *SLOW_MACHINE))
    jobs.append(job)
    codes = [p.wait(180) for p in job.procs]
    out = job.output()
    assert codes == [1, 1, 1], out
    expected = (
        "diagnosis: ranks 0, 2 wait in all_reduce #3 (group default, float32[4]); "
        f"rank 1 (host {rank1_host(job, net.hosts)}, pid "
    )
    # exactly one node gathered the report (the first to see the hang); the others were told
    assert out.count("([debug] hang_timeout: no collective completed, no timeline event); gathering") == 1, out
    for n in range(3):
        agent = job.outs[n].read_text()
        report = agent[agent.index("root cause") :]
        assert "no progress for 3s ([debug] hang_timeout), killed (signal SIGKILL); hang " + expected in report, agent
        assert frame in report, agent
        assert "failed after 0 of 0 restart(s)" in agent
        failure = json.loads((tmp_path / f"logs{n}" / "failure.json").read_text())
        assert expected in failure["root_cause"]["reason"]
        kept = (tmp_path / f"logs{n}" / "hang_report.txt").read_text()  # next to failure.json, on every node
        assert "([debug] hang_timeout" in kept.splitlines()[0], kept
        assert expected in kept, kept
        assert frame in kept, kept


def test_a_job_slower_than_nothing_but_faster_than_the_hang_timeout_runs_to_its_end(
    hosts, tmp_path: Path, jobs: list[HungJob]
) -> None:
    net = hosts(3)
    # one all_reduce a second for 14 s: more than twice the timeout, never a second without progress
    # (6 s: a peer starved of CPU on a loaded 2-core machine delays a step by seconds)
    extra = ("--set", "debug.hang_timeout=6s", *SLOW_MACHINE)
    job = HungJob(tmp_path, "slow", nproc=1, hosts=net.hosts, extra=extra, env={"SLOW_STEPS": "14"})
    jobs.append(job)
    codes = [p.wait(180) for p in job.procs]
    out = job.output()
    assert codes == [0, 0, 0], out
    assert all(f"rank {r} done" in out for r in range(3)), out
    assert "no progress" not in out, out


def test_the_restart_budget_applies_to_a_hang(tmp_path: Path, jobs: list[HungJob]) -> None:
    """A hang is a failure like any other: the job restarts while the budget allows, then fails."""
    job = HungJob(tmp_path, "queue", nproc=2, restarts=1, extra=("--set", "debug.hang_timeout=2s"))
    jobs.append(job)
    assert job.procs[0].wait(180) == 1, job.output()
    out = job.output()
    assert out.count("([debug] hang_timeout: no collective completed, no timeline event); gathering") == 2, out
    assert "restarting the job (1 of 1 restart(s) used)" in out, out
    assert "failed after 1 of 1 restart(s)" in out, out
    report = out[out.index("root cause") :]
    assert f"never entered it: wait <- hang.py:{line_of('return q.get()')}" in report, out


def test_a_collective_timeout_gathers_the_report_on_every_node_before_it_is_raised(
    hosts, tmp_path: Path, jobs: list[HungJob]
) -> None:
    net = hosts(3)
    job = HungJob(tmp_path, "facade", nproc=1, hosts=net.hosts, extra=SLOW_MACHINE)
    jobs.append(job)
    codes = [p.wait(180) for p in job.procs]
    out = job.output()
    assert codes == [1, 1, 1], out
    expected = (
        "diagnosis: ranks 0, 2 wait in all_reduce #3 (group default, float32[4]); "
        f"rank 1 (host {rank1_host(job, net.hosts)}, pid "
    )
    frame = f"never entered it: wait_for_batch_python at hang.py:{line_of('sum(range(1000))')}"
    # both waiting ranks asked; one agent gathered, the other took its diagnosis
    assert out.count("CollectiveTimeout in all_reduce on WORLD after 3s: rank(s) 1 did not arrive; gathering") == 1
    for n in range(3):
        agent = job.outs[n].read_text()
        report = agent[agent.index("root cause") :]
        assert "exit code 1 after a collective timed out; hang " + expected in report, agent
        assert frame in report, agent
        assert "CollectiveTimeout" in report, agent  # the exception, from the worker's error file
        kept = (tmp_path / f"logs{n}" / "hang_report.txt").read_text()
        assert "CollectiveTimeout in all_reduce" in kept.splitlines()[0], kept
        assert expected in kept, kept
    # the raising worker printed the diagnosis before its traceback
    assert "rallypoint: hang report of every worker (agent log dir, hang_report.txt): " + expected in out, out
