"""Preemption notices on the agent's side: exit 75 after one (requeue), and the scheduler's restart count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rallypoint.agent.notices import PREEMPTED_EXIT, NoticeLog

CLI = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]
WORKER = """
import json, os, sys, time
from rallypoint.agent.preemption import preempted, watch
watch()
keys = ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "RALLYPOINT_LAUNCH_RESTART_COUNT")
info = {"pid": os.getpid(), **{k: os.environ.get(k) for k in keys}}
open(sys.argv[1] + ".tmp", "w").write(json.dumps(info))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while not preempted():
    time.sleep(0.02)
"""
SLURM = {
    "SLURM_JOB_ID": "31",
    "SLURM_JOB_NODELIST": "n1",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURMD_NODENAME": "n1",
    "SLURM_RESTART_COUNT": "2",
}


def test_the_exit_code_after_a_notice() -> None:
    said: list[str] = []
    log = NoticeLog([signal.SIGTERM, signal.SIGUSR2], said.append)
    assert log.after_signal(signal.SIGTERM) == PREEMPTED_EXIT == 75
    assert log.after_signal(signal.SIGINT) == 128 + signal.SIGINT  # not a notice
    assert log.after_run(0) == 0  # nothing outlived: the job succeeded
    log.outlive(signal.SIGUSR2, None)
    assert log.after_run(0) == PREEMPTED_EXIT  # the workers ended on the warning: not done
    assert log.after_run(1) == 1  # a failure stays one
    assert said[-1].startswith("the workers ended after a preemption notice (SIGUSR2), before the job's end: exit 75")
    assert NoticeLog([], said.append).after_signal(signal.SIGTERM) == 143  # outside a launch environment


def _start(tmp_path: Path, environ: dict[str, str]) -> tuple[subprocess.Popen[str], dict[str, str]]:
    (tmp_path / "worker.py").write_text(WORKER)
    info = tmp_path / "info.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RALLYPOINT_", "PET_", "JOB_COMPLETION"))}
    env.update(environ)
    argv = [*CLI, "run", "--rdzv-backend", "memory", "--log-dir", str(tmp_path / "logs")]
    agent = subprocess.Popen(
        [*argv, str(tmp_path / "worker.py"), str(info)], env=env, cwd=tmp_path, text=True, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not info.exists():
        if agent.poll() is not None or time.monotonic() > deadline:
            agent.kill()
            raise AssertionError(f"the worker did not start: {agent.communicate()[1]}")
        time.sleep(0.05)
    return agent, json.loads(info.read_text())


def _end(agent: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = agent.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        agent.kill()
        raise
    return agent.returncode, err


def test_under_slurm_the_agent_outlives_the_warning_and_exits_75_after_its_workers(tmp_path: Path) -> None:
    agent, info = _start(tmp_path, SLURM)
    # a requeued job: the workers' restart count goes on from Slurm's
    assert info["TORCHELASTIC_RESTART_COUNT"] == "2"
    assert info["RALLYPOINT_LAUNCH_RESTART_COUNT"] == "2"
    assert info["TORCHELASTIC_MAX_RESTARTS"] == "3"  # the budget is this run's own
    for pid in (agent.pid, int(info["pid"])):  # as Slurm's --signal=USR2@90 does: every process of the step
        os.kill(pid, signal.SIGUSR2)
    code, err = _end(agent)
    assert code == PREEMPTED_EXIT, err
    assert "the workers ended after a preemption notice (SIGUSR2), before the job's end: exit 75" in err
    assert "succeeded" not in err


@pytest.mark.parametrize(("environ", "expected"), [(SLURM, PREEMPTED_EXIT), ({}, 128 + signal.SIGTERM)])
def test_sigterm_is_a_notice_only_under_a_launch_environment(
    tmp_path: Path, environ: dict[str, str], expected: int
) -> None:
    agent, info = _start(tmp_path, environ)
    assert info["TORCHELASTIC_RESTART_COUNT"] == ("2" if environ else "0")
    agent.send_signal(signal.SIGTERM)
    code, err = _end(agent)
    assert code == expected, err
    assert ("stopped on a preemption notice (SIGTERM): exit 75" in err) == bool(environ)
