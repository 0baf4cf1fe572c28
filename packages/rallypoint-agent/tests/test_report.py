"""Tests of rallypoint.agent.report: the console report and ``failure.json`` on a full disk.

The full disk is a real one: a 64 KiB tmpfs mounted for the test (the tests run as root, as CI
does) and filled to the last byte.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.agent.report import FailureReport, WorkerFailure


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, unmounted after the test; the test fills it with :func:`fill`."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.fail(f"cannot mount a tmpfs (the tests run as root, as CI does): {done.stderr.decode()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def fill(directory: Path) -> None:
    """Write zeros into ``directory/filler`` until the file system is full."""

    def write_until_full() -> None:
        with open(directory / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)

    with pytest.raises(OSError, match="No space left on device"):
        write_until_full()


def report() -> FailureReport:
    failure = WorkerFailure(
        rank=1, local_rank=1, host="h", node_id="n", attempt=0, pid=7, exit_code=1, signal=None,
        time=1.0, reason="exit code 1", exception="ValueError: boom", stderr_tail=("x" * 200,) * 100,
    )  # fmt: skip
    return FailureReport.build("r", [failure], restarts=0, max_restarts=0)


def test_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = report().write(tmp_path / "logs" / "failure.json")
    assert json.loads(path.read_text())["root_cause"]["rank"] == 1
    assert os.listdir(tmp_path / "logs") == ["failure.json"]  # no temporary file left


def test_a_full_disk_leaves_the_previous_failure_json_whole(full_disk: Path) -> None:
    path = full_disk / "failure.json"
    path.write_text('{"previous": true}\n')
    fill(full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        report().write(path)
    assert json.loads(path.read_text()) == {"previous": True}  # not truncated
    assert sorted(os.listdir(full_disk)) == ["failure.json", "filler"]  # the temporary file is gone


def test_a_full_disk_writes_no_failure_json_and_save_says_why(full_disk: Path) -> None:
    fill(full_disk)
    line = report().save(full_disk / "failure.json")
    assert line.startswith(f"the report above could not be written to {full_disk / 'failure.json'}")
    assert "No space left on device (ENOSPC)" in line
    assert sorted(os.listdir(full_disk)) == ["filler"]


def test_save_names_the_written_file(tmp_path: Path) -> None:
    assert report().save(tmp_path / "failure.json") == f"full report: {tmp_path / 'failure.json'}"


def test_the_report_counts_the_lines_the_console_did_not_show(tmp_path: Path) -> None:
    quiet = report()
    assert "console:" not in quiet.format()
    assert quiet.to_json()["console_not_shown"] == 0
    behind = report()
    behind.console_not_shown = 1234
    assert behind.format().endswith("\n\nconsole: 1234 line(s) not shown here; the log files have every line")
    assert json.loads(behind.write(tmp_path / "failure.json").read_text())["console_not_shown"] == 1234
