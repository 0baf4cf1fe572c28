"""Smoke test of tools/bench/rendezvous.py: one small size, both sides, ratio printed last."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.harness import parse_ratio_line

BENCH_DIR = Path(__file__).resolve().parents[1]
SCRIPT = BENCH_DIR / "rendezvous.py"


def test_rendezvous_help_runs_nothing():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "--sizes" in proc.stdout
    assert "--smoke" in proc.stdout


def test_rendezvous_rejects_bad_sizes():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "2,x"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--sizes" in proc.stderr


@pytest.mark.slow
def test_rendezvous_smoke_prints_the_ratio_last():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--sizes", "2"], capture_output=True, text=True, timeout=40
    )
    assert proc.returncode == 0, proc.stderr
    a, b, ratio = parse_ratio_line(proc.stdout)
    assert (a, b) == ("rallypoint", "torch")
    assert ratio > 0
    assert "rendezvous N=2" in proc.stdout
    assert "headline at N=2" in proc.stdout
