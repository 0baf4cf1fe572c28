"""tools/bench/agent.py: a P3b run that hangs is killed with its whole tree and excluded, not fatal;
P1k measures a warm process kept from a priming run."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.bench import agent
from tools.bench.harness import BenchmarkError, parse_ratio_line

# a launcher that hangs: it starts a worker in a session of its own (as torchrun's may be), then sleeps
HANGS = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(os.path.join(os.environ["RP_BENCH_OUT"], "..", "child.pid"), "w").write(str(child.pid))
time.sleep(600)
"""

# a launcher whose restart worked: the files a P3b run leaves, with a 0.25 s latency
RESTARTS = """
import os
out = os.environ["RP_BENCH_OUT"]
for name, value in {"started-0-0": 1.0, "started-0-1": 1.0, "kill": 10.0, "step-1-0": 10.2, "step-1-1": 10.25}.items():
    open(os.path.join(out, name), "w").write(repr(value))
"""


def side(tmp_path: Path, body: str, name: str, notes: list[str]) -> agent.RestartSide:
    return agent.RestartSide(
        [sys.executable, "-c", body], str(tmp_path), agent.VirtualClock(), name, mark="step", notes=notes, timeout=1.0
    )


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_hung_run_is_killed_with_its_workers_and_gives_no_sample(tmp_path: Path) -> None:
    notes: list[str] = []
    hung = side(tmp_path, HANGS, "torchrun", notes)
    started = time.monotonic()
    assert hung.sample("round 0") is None
    assert time.monotonic() - started < 10
    assert hung.hung == 1
    assert notes == ["  round 0: torchrun hung (1 s), killed, excluded"]
    child = int((tmp_path / "child.pid").read_text())
    assert not alive(child)  # the worker in its own session went too


def test_hung_rounds_are_excluded_and_the_rest_measured(tmp_path: Path) -> None:
    notes: list[str] = []
    ours = side(tmp_path, RESTARTS, "rallypoint", notes)
    theirs = side(tmp_path, HANGS, "torchrun", notes)
    calls = {"n": 0}
    original = theirs.run_once

    def hangs_once() -> float:  # torchrun hangs in its first run only, then restarts in 3 s
        calls["n"] += 1
        return original() if calls["n"] == 1 else 3.0

    theirs.run_once = hangs_once  # type: ignore[method-assign]
    args = argparse.Namespace(rounds=3, warmup=0, number=1, smoke=False, verbose=False)
    comparison = agent._compare_excluding_hung(args, ours, theirs)
    assert comparison.a.samples == pytest.approx((0.25, 0.25, 0.25))
    assert comparison.b.samples == (3.0, 3.0)  # round 0's hung run left out
    assert theirs.hung == 1
    assert any("torchrun hung (1 s)" in note for note in notes)


def test_every_run_hung_is_an_error_naming_the_side(tmp_path: Path) -> None:
    ours = side(tmp_path, RESTARTS, "rallypoint", [])
    theirs = side(tmp_path, HANGS, "torchrun", [])
    args = argparse.Namespace(rounds=1, warmup=0, number=1, smoke=False, verbose=False)
    with pytest.raises(BenchmarkError, match="every torchrun run hung"):
        agent._compare_excluding_hung(args, ours, theirs)


@pytest.mark.slow
def test_p1k_smoke_run_reuses_one_kept_warm_process() -> None:
    script = Path(agent.__file__)
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--only", "p1k"],
        capture_output=True,
        text=True,
        timeout=240,
        env={k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "P1k agent: whole command with the warm process kept from a previous run" in proc.stdout
    assert "the first run on a node costs what P1w measures" in proc.stdout
    a, b, ratio = parse_ratio_line(proc.stdout)
    assert (a, b) == ("rallypoint", "torch")
    assert ratio > 0
