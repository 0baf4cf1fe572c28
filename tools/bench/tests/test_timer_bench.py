"""Smoke test of tools/bench/timer.py: both measurements run, the watchdog ratio is printed last."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.harness import parse_ratio_line

SCRIPT = Path(__file__).resolve().parents[1] / "timer.py"


def test_timer_help_runs_nothing():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "--watchdog-calls" in proc.stdout
    assert "--smoke" in proc.stdout


@pytest.mark.slow
def test_timer_smoke_prints_the_watchdog_ratio_last():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    a, b, ratio = parse_ratio_line(proc.stdout)
    assert (a, b) == ("rallypoint", "torch")
    assert ratio > 0
    assert "timer 1/2: one recorded event" in proc.stdout
    assert "target <= 2 us:" in proc.stdout
    assert "timer 2/2: watchdog acquire + release" in proc.stdout
