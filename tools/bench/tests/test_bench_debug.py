"""tools/bench/debug_overhead.py (#40): a smoke run prints its figures."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "debug_overhead.py"


@pytest.mark.slow
def test_smoke_run_prints_the_flight_costs_the_step_ratio_and_the_answer_times() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--workers", "8"], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    for what in ("hook alone (synchronous)", "hook alone (async_op=True)"):
        assert re.search(rf"flight record cost per call, {re.escape(what)}: -?\d+\.\d\d us", proc.stdout)
    for what in ("collective", "collective, async_op=True", "collective, 2 ranks", "facade collective, 2 ranks"):
        assert re.search(rf"flight record cost per {what}: -?\d+\.\d\d us", proc.stdout), proc.stdout
    assert re.search(r"ratio debuggable/plain: \d+\.\d+x", proc.stdout), proc.stdout
    assert re.search(r"debug stacks answer for 8 simulated workers on one node: median \d\.\d{3}s", proc.stdout)
    assert re.search(r"command to printed report, 8 simulated workers on one node: median \d+\.\d{3}s", proc.stdout)
