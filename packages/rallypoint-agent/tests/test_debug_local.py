"""Finding a one-node job's running workers on this machine, for ``rallypoint debug stacks``."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.agent.debug_local import latest_debug_dir, running_workers


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def _stacks_file(directory: Path, rank: int, pid: int) -> Path:
    path = directory / f"rank_{rank}.stacks"
    path.write_text(f"# rallypoint stacks pid={pid}\n")
    return path


def _holding(path: Path) -> subprocess.Popen[bytes]:
    """A process that keeps ``path`` open, as a worker keeps its stacks file."""
    code = f"import sys, time\nf = open({str(path)!r}, 'ab')\nprint('open', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"open\n"
    return proc


def test_the_newest_attempt_with_a_debug_directory(tmp_path: Path) -> None:
    assert latest_debug_dir(tmp_path) is None
    for n in (0, 2, 10):
        (tmp_path / f"attempt_{n}" / "debug").mkdir(parents=True)
    (tmp_path / "attempt_11").mkdir()  # started, no debug directory yet
    assert latest_debug_dir(tmp_path) == tmp_path / "attempt_10" / "debug"


def test_a_worker_is_one_that_holds_its_stacks_file_open(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    path = tmp_path / "rank_1.stacks"
    path.touch()
    worker = _holding(path)
    procs.append(worker)
    _stacks_file(tmp_path, 1, worker.pid)
    assert running_workers(tmp_path) == {1: (worker.pid, 1)}


def test_a_pid_that_does_not_hold_the_file_is_never_listed(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    # a finished worker's pid, reused by another process: the real-time signal would kill it
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procs.append(other)
    _stacks_file(tmp_path, 0, other.pid)
    _stacks_file(tmp_path, 2, 2**22 + 7)  # no such process
    (tmp_path / "rank_3.stacks").write_text("not a header\n")
    assert running_workers(tmp_path) == {}
    time.sleep(0.1)
    assert other.poll() is None
