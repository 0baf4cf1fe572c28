"""A failing job whose log directory is a full disk: the report still reaches the console.

The log directory is a real 64 KiB tmpfs (the tests run as root, as CI does), mounted for the
test (private, mode 0700: a tmpfs is 1777 by default, which the agent refuses for a log
directory) and always unmounted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

#: Fills the log directory (through the agent's log files), then fails with a known error.
NOISY_CRASH = """
import sys
from rallypoint.agent.error_files import record

@record
def main():
    for i in range(4000):
        print(f"noise line {i} " + "x" * 40, file=sys.stderr)
    raise ValueError("planned failure after the disk filled")

main()
"""


def run_job(tmp_path: Path, run_id: str, log_dir: Path) -> subprocess.CompletedProcess[str]:
    """``rallypoint run`` of :data:`NOISY_CRASH` on one worker, no restarts, logs in ``log_dir``."""
    crash = tmp_path / "crash.py"
    crash.write_text(NOISY_CRASH)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    flags = ["--nproc-per-node", "1", "--max-restarts", "0", "--run-id", run_id, "--log-dir", str(log_dir)]
    return subprocess.run(
        [*RALLYPOINT, "run", *flags, str(crash)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def small_log_dir(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "logs"
    mount.mkdir()
    options = "size=64k,mode=0700"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.fail(f"cannot mount a tmpfs (the tests run as root, as CI does): {done.stderr.decode()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_log_disk_still_prints_the_report_and_leaves_no_torn_failure_json(
    tmp_path: Path, small_log_dir: Path
) -> None:
    result = run_job(tmp_path, "full", small_log_dir)
    assert result.returncode == 1, result.stderr[-3000:]
    err = result.stderr
    assert "internal error" not in err
    assert "job 'full' failed after 0 of 0 restart(s)" in err
    report = err[err.index("root cause (first failure of the last attempt):") :]
    # the error file could not be written either: the report falls back to the stderr tail
    assert "\n    ValueError: planned failure after the disk filled\n" in report
    failure_json = small_log_dir / "failure.json"
    assert f"the report above could not be written to {failure_json} (No space left on device (ENOSPC))" in err
    # whole or not at all: the disk is full, so not at all (and no temporary file is left)
    assert not failure_json.exists()
    assert not [p for p in small_log_dir.iterdir() if p.name.startswith(".failure.json")]
    assert any(p.stat().st_size > 0 for p in small_log_dir.rglob("*.log"))  # the logs did fill it


def test_failure_json_is_valid_json_when_the_disk_has_room(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    result = run_job(tmp_path, "room", logs)
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"full report: {logs / 'failure.json'}" in result.stderr
    report = json.loads((logs / "failure.json").read_text())
    assert report["root_cause"]["exception"] == "ValueError: planned failure after the disk filled"
