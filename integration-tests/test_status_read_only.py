"""``rallypoint status`` only reads: a mistyped path or run id creates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.core.cli import main
from rallypoint.rendezvous.state import count_key
from rallypoint_file.backend import FileBackend


def status(endpoint: Path, run_id: str) -> int:
    return main(["status", "--rdzv-backend", "file", "--rdzv-endpoint", str(endpoint), "--run-id", run_id])


def test_status_with_a_mistyped_path_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    typo = tmp_path / "sahred" / "rdzv"
    code = status(typo, "job1")
    assert code != 0
    err = capsys.readouterr().err
    assert f"no rendezvous directory {typo / 'job1'}" in err
    assert "check the path and the run id" in err
    assert list(tmp_path.iterdir()) == []  # not even the first missing directory


def test_status_with_a_mistyped_run_id_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    FileBackend(tmp_path, "job1").set("agent/restarts", 0)
    assert status(tmp_path, "jbo1") != 0
    assert f"no rendezvous directory {tmp_path / 'jbo1'}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job1"]


def test_status_reads_a_job_without_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    backend = FileBackend(tmp_path, "job1")
    backend.add(count_key(0), 1)  # one node is gathering for round 0
    backend.set("agent/restarts", 2)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    assert status(tmp_path, "job1") == 0
    out = capsys.readouterr().out
    assert "joined:    1" in out
    assert "restarts:  2" in out
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
