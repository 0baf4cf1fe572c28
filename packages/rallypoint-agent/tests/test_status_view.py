"""``rallypoint status``: a closed job's outcome, per-rank state, ``--json`` and ``--watch``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rallypoint.core.cli import main

CLI = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]
#: rank 1 fails when the first argument says so; every rank waits for the file named by the second
SCRIPT = """
import os, sys, time
deadline = time.monotonic() + 60
while len(sys.argv) > 2 and not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.02)
sys.exit(1 if sys.argv[1] == "fail" and os.environ["RANK"] == "1" else 0)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "TORCHELASTIC_"))}


def _job(tmp_path: Path, run_id: str, *args: str) -> subprocess.Popen[str]:
    (tmp_path / "job.py").write_text(SCRIPT)
    argv = [*CLI, "run", "--nproc-per-node", "2", "--rdzv-backend", "file", "--rdzv-endpoint", str(tmp_path / "rdzv"),
            "--rdzv-id", run_id, "--max-restarts", "0", "job.py", *args]  # fmt: skip
    return subprocess.Popen(argv, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _status(tmp_path: Path, run_id: str, *flags: str) -> list[str]:
    return ["status", "--rdzv-backend", "file", "--rdzv-endpoint", str(tmp_path / "rdzv"), "--run-id", run_id, *flags]


@pytest.mark.parametrize("outcome", ["ok", "fail"])
def test_a_closed_job_says_whether_it_succeeded(outcome: str, tmp_path: Path, capsys) -> None:
    proc = _job(tmp_path, f"st-{outcome}", outcome)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == (0 if outcome == "ok" else 1), output

    assert main(_status(tmp_path, f"st-{outcome}", "--json")) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["closed"] is True
    assert snap["succeeded"] is (outcome == "ok")
    assert snap["state"] == ("succeeded" if outcome == "ok" else "failed")
    assert len(snap["nodes"]) == 1
    assert snap["nodes"][0]["ranks"] == [0, 1]
    if outcome == "fail":
        assert snap["ranks"] == {"0": "stopped", "1": "failed"}
        assert [(f["rank"], f["reason"]) for f in snap["failures"]] == [(1, "exit code 1")]
    else:
        assert snap["ranks"] == {"0": "succeeded", "1": "succeeded"}
    assert main(_status(tmp_path, f"st-{outcome}")) == 0
    text = capsys.readouterr().out
    assert "round:     0 (closed)" in text
    assert f"job {'succeeded' if outcome == 'ok' else 'failed'}" in text.split("ended:")[1].splitlines()[0]


def test_watch_follows_a_running_job_until_it_ends(tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = _job(tmp_path, "st-watch", "ok", str(go))
    watcher = subprocess.Popen([*CLI, *_status(tmp_path, "st-watch", "--watch", "--json", "--interval", "0.05")],
                               cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert watcher.stdout is not None
        seen = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # each change is one JSON line; release the job once it runs
            line = watcher.stdout.readline()
            if not line:
                break
            snap = json.loads(line)
            seen.append(snap)
            if snap is not None and snap["state"] == "running" and not go.exists():
                go.write_text("")
        assert watcher.wait(timeout=60) == 0
    finally:
        go.write_text("")
        proc.communicate(timeout=120)
        watcher.kill()
    states = [s["state"] for s in seen if s is not None]
    assert "running" in states
    assert states[-1] == "succeeded"
    assert seen[-1]["succeeded"] is True
    running = next(s for s in seen if s is not None and s["state"] == "running")
    assert running["ranks"] == {"0": "running", "1": "running"}


def test_status_of_an_unknown_run_is_1(tmp_path: Path, capsys) -> None:
    proc = _job(tmp_path, "st-other", "ok")
    proc.communicate(timeout=120)
    assert main(_status(tmp_path, "nope", "--json")) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["found"] is False
    assert "no rendezvous state for run 'nope'" in out["error"]
