"""A running job whose file-backend run directory is deleted, made immutable or corrupted.

The agent must stop its workers and fail within ``heartbeat_timeout``, naming the path (it used to
run on unaware, or hang until the join timeout).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]
HEARTBEAT_TIMEOUT = 10

WORKER = """
import os, sys, time
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
"""

JOB = """
[job]
entrypoint = "{worker}"
args = ["{pid_file}"]
[rendezvous]
backend = "file"
run_id = "{run_id}"
heartbeat_timeout = "{heartbeat_timeout}s"
[rendezvous.options]
path = "{path}"
"""


def _chattr(flag: str, path: Path) -> None:
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"chattr {flag} {path} failed (the tests run as root, as CI does): {done.stderr}")


@pytest.fixture
def undo() -> Iterator[list[Callable[[], None]]]:
    steps: list[Callable[[], None]] = []
    yield steps
    for step in steps:
        step()


def _delete(root: Path, undo: list[Callable[[], None]]) -> str:
    shutil.rmtree(root)
    return f"the rendezvous directory {root} of run 'job' was deleted while the job ran"


def _immutable(root: Path, undo: list[Callable[[], None]]) -> str:
    _chattr("+i", root)
    undo.append(lambda: _chattr("-i", root))
    return f"rendezvous directory {root} of run 'job' can no longer be written"


def _corrupt(root: Path, undo: list[Callable[[], None]]) -> str:
    (root / "lock").write_bytes(b"garbage")
    return f"rendezvous revision counter in {root / 'lock'} is corrupt"


DAMAGE = {"deleted": _delete, "immutable": _immutable, "counter-corrupt": _corrupt}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_running_job_fails_within_the_heartbeat_timeout(
    tmp_path: Path, case: str, undo: list[Callable[[], None]]
) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    pid_file = tmp_path / "worker.pid"
    rdzv = tmp_path / "rdzv"
    job = tmp_path / "job.toml"
    job.write_text(
        JOB.format(worker=worker, pid_file=pid_file, run_id="job", heartbeat_timeout=HEARTBEAT_TIMEOUT, path=rdzv)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    agent = subprocess.Popen(
        [*RALLYPOINT, "run", str(job)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists():
            assert agent.poll() is None, agent.communicate()
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.05)
        expected = DAMAGE[case](rdzv / "job", undo)
        _, err = agent.communicate(timeout=HEARTBEAT_TIMEOUT)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    assert agent.returncode not in (0, None)
    assert expected in err
    assert "internal error" not in err
    assert not alive(int(pid_file.read_text()))  # the agent stopped its worker
