"""tools/bench/rpc.py: --help runs nothing, bad cases exit 2, a smoke run checks every reply and ends with the ratio."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.harness import parse_ratio_line

SCRIPT = Path(__file__).resolve().parents[1] / "rpc.py"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def test_help_and_bad_cases() -> None:
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--cases", "--tensorpipe", "--smoke"):
        assert option in proc.stdout
    proc = run("--cases", "small,huge")
    assert proc.returncode == 2
    assert "--cases" in proc.stderr


@pytest.mark.slow
def test_smoke_run_of_every_case() -> None:
    proc = run("--smoke", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for case in ("rpc small", "rpc 1mb", "rpc remote"):
        assert case in proc.stdout
    assert "each side in its own caller and callee processes" in proc.stdout
    assert parse_ratio_line(proc.stdout)[:2] == ("rallypoint", "torch")
