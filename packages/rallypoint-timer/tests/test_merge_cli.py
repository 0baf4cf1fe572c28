"""Merged timeline, Chrome trace export and ``rallypoint timeline merge|report`` on real worker logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rallypoint.timer.merge import merge_logs, step_report

CLI = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

# Rank 1 is slow in step 1 (by half a second: far more than a busy machine delays a 10 ms step);
# every rank idles 20 ms before step 2.
WORKER = textwrap.dedent(
    """
    import os, time
    from rallypoint import timer
    rank = int(os.environ["RANK"])
    for step in range(3):
        if step == 2:
            time.sleep(0.02)
        with timer.event("step", step=step):
            with timer.event("forward"):
                time.sleep(0.01)
            if step == 1 and rank == 1:
                time.sleep(0.5)
    """
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("run")
    procs = []
    for rank in range(3):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "3",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "RALLYPOINT_TIMELINE_FILE": str(root / "attempt_0" / "timeline" / f"rank_{rank}.jsonl"),
        }
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env))
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    return root


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def test_merge_writes_valid_chrome_trace_with_every_rank(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    result = cli("timeline", "merge", str(run_dir), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "ranks 0, 1, 2" in result.stdout
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    assert isinstance(events, list)
    assert events
    for ev in events:
        assert ev["ph"] in ("X", "M")
        assert isinstance(ev["pid"], int)
        assert isinstance(ev["tid"], int)
        assert isinstance(ev["name"], str)
        if ev["ph"] == "X":
            assert isinstance(ev["ts"], float)
            assert ev["ts"] >= 0
            assert isinstance(ev["dur"], float)
            assert ev["dur"] >= 0
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1, 2}
    for rank in range(3):
        mine = [e["name"] for e in spans if e["pid"] == rank]
        assert mine.count("step") == 3
        assert mine.count("forward") == 3
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {n.split(" (")[0] for n in names} == {"rank 0", "rank 1", "rank 2"}


def test_report_names_the_slowest_rank_stragglers_and_gaps(run_dir: Path) -> None:
    reports = step_report(merge_logs([run_dir]))
    assert [r.step for r in reports] == [0, 1, 2]
    assert reports[1].slowest_rank == 1
    assert reports[1].stragglers == (1,)
    assert reports[0].gap_ns == {}
    assert all(gap >= 15_000_000 for gap in reports[2].gap_ns.values())

    result = cli("timeline", "report", str(run_dir))
    assert result.returncode == 0, result.stderr
    row = next(line.split() for line in result.stdout.splitlines() if line.split()[:2] == ["0", "1"])
    assert row[4] == "1"
    assert row[-1] == "1"
    assert "slowest most often" in result.stdout

    as_json = json.loads(cli("timeline", "report", str(run_dir), "--json").stdout)
    assert as_json["ranks"] == [0, 1, 2]
    assert as_json["steps"][1]["stragglers"] == [1]


def test_cli_without_logs_explains(tmp_path: Path) -> None:
    result = cli("timeline", "report", str(tmp_path))
    assert result.returncode == 1
    assert "no timeline logs" in result.stderr
    assert "timeline = true" in result.stderr
    assert "Traceback" not in result.stderr


def test_timeline_command_is_listed() -> None:
    result = cli("--help")
    assert "timeline" in result.stdout
