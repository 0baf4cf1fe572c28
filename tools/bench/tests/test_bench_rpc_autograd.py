"""tools/bench/rpc_autograd.py: --help runs nothing; a smoke run checks the gradients and ends with the ratio.

The smoke run also checks the set-up: each side in its own caller and callee processes, so that
neither RPC system runs in a process whose threads the other one changed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.harness import parse_ratio_line

SCRIPT = Path(__file__).resolve().parents[1] / "rpc_autograd.py"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def test_help_and_bad_path() -> None:
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--path", "--smoke", "--number", "--threads", "--layer"):
        assert option in proc.stdout
    proc = run("--path", "carrier-pigeon")
    assert proc.returncode == 2
    assert "--path" in proc.stderr
    proc = run("--layer", "transformer")
    assert proc.returncode == 2
    assert "--layer" in proc.stderr
    proc = run("--threads", "-1")
    assert proc.returncode == 2
    assert "--threads" in proc.stderr


@pytest.mark.slow
def test_smoke_run() -> None:
    proc = run("--smoke", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for figure in ("backward: median ratio", "step: median ratio"):
        assert figure in proc.stdout
    assert "each side in its own caller and callee processes, OMP_NUM_THREADS=1" in proc.stdout
    assert parse_ratio_line(proc.stdout)[:2] == ("rallypoint", "torch")


@pytest.mark.slow
def test_smoke_run_of_the_cheap_layer() -> None:
    """--layer prelu: the gradient check holds for the elementwise layer too."""
    proc = run("--smoke", "--layer", "prelu", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "through one remote nn.PReLU(1024)" in proc.stdout
    assert parse_ratio_line(proc.stdout)[:2] == ("rallypoint", "torch")
