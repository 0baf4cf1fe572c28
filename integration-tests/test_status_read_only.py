"""``rallypoint status`` (and ``debug stacks``) only read: a mistyped path or run id creates nothing,
and a ``c10d``/``grpc`` endpoint with no server gets none from them.

With ``serve = "auto"`` the first process to bind a grpc endpoint hosts the rendezvous server. A
``status --watch`` started before its job used to be that process: the job's agents connected to
the watch, and an interrupted watch took their rendezvous down.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
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


CLI = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}


def test_a_watch_started_before_a_c10d_job_never_hosts_its_rendezvous(tmp_path: Path) -> None:
    port = _free_port()
    argv = [*CLI, "status", "--watch", "--json", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    watch = subprocess.Popen(
        [*argv, "--run-id", "later"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and watch.poll() is None and not _listening(port):
            time.sleep(0.2)
        assert watch.poll() is None, watch.communicate()[0]
        assert not _listening(port), "status --watch serves the job's rendezvous"
    finally:
        watch.kill()
        watch.wait()


@pytest.mark.parametrize("command", [("status",), ("debug", "stacks")])
def test_a_c10d_endpoint_with_no_server_is_said_unreachable(tmp_path: Path, command: tuple[str, ...]) -> None:
    flags = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--run-id", "none"]
    done = subprocess.run(
        [*CLI, *command, *flags], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "unreachable" in done.stderr, done.stderr  # not an empty rendezvous it served itself
    assert "Task was destroyed" not in done.stderr
