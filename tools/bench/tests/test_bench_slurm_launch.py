"""tools/bench/slurm_launch.py: one job per side on the namespace Slurm cluster, and its breakdown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.harness import parse_ratio_line

SCRIPT = Path(__file__).resolve().parents[1] / "slurm_launch.py"
PHASES = ("Slurm: sbatch to batch script", "import torch", "first step (DDP, forward, backward, optimizer)")


@pytest.mark.slow
def test_one_round_submits_a_job_per_side_and_prints_where_the_time_went(tmp_path: Path) -> None:
    data = tmp_path / "slurm.json"
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--json", str(data)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    a, b, ratio = parse_ratio_line(proc.stdout)
    assert (a, b) == ("rallypoint", "torch")
    assert ratio > 0
    for phase in PHASES:
        assert phase in proc.stdout
    stored = json.loads(data.read_text())
    assert stored["rounds"] == 1
    for label in ("rallypoint", "torch"):
        (phases,) = stored["phases"][label]
        stamps = [phases[k] for k in ("submitted", "batch", "task", "started", "imported", "grouped", "stepped")]
        assert stamps == sorted(stamps), phases  # every phase ends after the one before
        assert stored["sides"][label]["samples"] == [pytest.approx(phases["stepped"] - phases["submitted"])]


def test_bad_counts_exit_2() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--nodes", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--nodes" in proc.stderr
