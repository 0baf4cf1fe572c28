"""``rallypoint debug stacks`` on a one-node job on the default memory backend, run where the job runs.

The memory backend has no key space outside the agent, so the command finds the job through its
log directory, as ``rallypoint status`` does, and reads its workers on this machine. It used to
refuse with "debug stacks needs a shared backend", although the debugging page promises it for
any job that ``rallypoint run`` started.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ddp_jobs import clean_env
from hung_jobs import CLI, SCRIPT, line_of


def _stacks(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*CLI, "debug", "stacks", *args]
    return subprocess.run(argv, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=30, check=False)


def test_debug_stacks_of_a_one_node_job_needs_no_flag(tmp_path: Path) -> None:
    argv = [*CLI, "run", "--nproc-per-node", "3", "--max-restarts", "0", str(SCRIPT), "queue"]
    out = tmp_path / "agent.out"
    with out.open("w") as f:
        job = subprocess.Popen(argv, cwd=tmp_path, env=clean_env(), stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while not all(f"rank {r} ready" in out.read_text() for r in range(3)):
            assert job.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        time.sleep(1.0)  # the others reach the fourth all_reduce
        started = time.monotonic()
        done = _stacks(tmp_path)
        took = time.monotonic() - started
        assert done.returncode == 0, done.stdout + done.stderr
        assert took < 5.0, f"debug stacks took {took:.1f}s"
        diagnosis = next(line for line in done.stdout.splitlines() if line.startswith("diagnosis:"))
        assert diagnosis.startswith("diagnosis: ranks 0, 2 wait in all_reduce #3 (group default, float32[4]); rank 1 ")
        assert f"never entered it: wait <- hang.py:{line_of('return q.get()')}" in diagnosis, done.stdout
        assert done.stdout.splitlines()[-1].startswith("(3 worker(s) on 1 node(s), ")
        doc = json.loads(_stacks(tmp_path, "--json").stdout)
        assert sorted(w["rank"] for w in doc["workers"]) == [0, 1, 2]
        assert all(w["dumped"] for w in doc["workers"]), doc
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(60)
    ended = _stacks(tmp_path)
    assert ended.returncode == 1, ended.stdout + ended.stderr
    # stopped by a signal, the job is not closed in status.json, but no worker holds its stacks file
    assert "no worker is running" in ended.stderr or "no node is running" in ended.stderr, ended.stderr


def test_debug_stacks_without_a_job_says_where_it_looked(tmp_path: Path) -> None:
    done = _stacks(tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no job found under 'runs/{run_id}'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("flag", [(), ("--rdzv-backend", "memory")])
def test_the_memory_backend_is_no_longer_refused(tmp_path: Path, flag: tuple[str, ...]) -> None:
    done = _stacks(tmp_path, *flag)
    assert "needs a shared backend" not in done.stderr, done.stderr


@pytest.mark.parametrize("command", [("status",), ("debug", "stacks")])
def test_the_help_says_how_a_one_node_job_is_found(command: tuple[str, ...]) -> None:
    done = subprocess.run([*CLI, *command, "--help"], env=clean_env(COLUMNS="200"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "A one-node job on the memory backend is read" in text, done.stdout
    assert "in the directory the job ran from" in text, done.stdout
