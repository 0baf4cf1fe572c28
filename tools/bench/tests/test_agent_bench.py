"""Smoke test of tools/bench/agent.py: P1 in smoke mode, both launchers, ratio printed last."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.harness import parse_ratio_line

BENCH_DIR = Path(__file__).resolve().parents[1]
SCRIPT = BENCH_DIR / "agent.py"


def test_agent_help_runs_nothing():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "--only" in proc.stdout
    assert "--smoke" in proc.stdout


def test_agent_rejects_unknown_measure():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--only", "p2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--only" in proc.stderr


@pytest.mark.slow
def test_agent_smoke_p1_prints_the_ratio_last():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--only", "p1"], capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    a, b, ratio = parse_ratio_line(proc.stdout)
    assert (a, b) == ("rallypoint", "torch")
    assert ratio > 0
    assert "P1 agent: whole command" in proc.stdout
    assert "rallypoint --version" in proc.stdout
    assert "headline (P1)" in proc.stdout
