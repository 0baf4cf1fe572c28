"""Smoke test of tools/bench/collectives.py: both sides run on a real 2-rank Gloo group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.harness import parse_ratio_line

SCRIPT = Path(__file__).resolve().parents[1] / "collectives.py"


def test_collectives_help_runs_nothing():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "--backend" in proc.stdout
    assert "--smoke" in proc.stdout


@pytest.mark.slow
def test_collectives_smoke_prints_the_ratio_last():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    a, b, ratio = parse_ratio_line(proc.stdout)
    assert (a, b) == ("rallypoint", "torch")
    assert ratio > 0
    for case in ("all_reduce 1MB", "all_reduce 64MB", "barrier"):
        assert case in proc.stdout


@pytest.mark.slow
def test_collectives_overhead_smoke_prints_both_cases():
    script = SCRIPT.with_name("collectives_overhead.py")
    proc = subprocess.run([sys.executable, str(script), "--smoke"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "all_reduce of 16 floats" in proc.stdout
    a, b, ratio = parse_ratio_line(proc.stdout)  # the barrier case comes last
    assert (a, b) == ("rallypoint", "torch")
    assert ratio > 0
