"""tools/bench/grpc_server_scale.py: a small round completes, checked, with the server's and clients' figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "grpc_server_scale.py"


@pytest.mark.slow
def test_a_small_server_scale_round_completes_and_reports_cpu_and_memory() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--nodes", "24", "--procs", "2"], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "grpc server scale: 24 nodes (2 client processes x 12 threads, one channel each)" in out
    for line in ("one round, release to last next_rendezvous() return:", "server CPU during the round:"):
        assert line in out
    assert "client processes' CPU during the round:" in out
    assert "server memory:" in out
