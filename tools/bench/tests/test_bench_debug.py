"""tools/bench/debug_overhead.py (#40): a smoke run prints its three figures."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "debug_overhead.py"


@pytest.mark.slow
def test_smoke_run_prints_the_flight_cost_the_step_ratio_and_the_answer_time() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--workers", "8"], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"flight record cost per collective: -?\d+\.\d\d us", proc.stdout), proc.stdout
    assert re.search(r"ratio debuggable/plain: \d+\.\d+x", proc.stdout), proc.stdout
    assert re.search(r"debug stacks answer for 8 simulated workers on one node: median \d\.\d{3}s", proc.stdout)
