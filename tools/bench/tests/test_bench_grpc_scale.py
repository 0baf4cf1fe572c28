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


@pytest.mark.slow
@pytest.mark.parametrize("client", ["threads", "aio"])
def test_a_floor_run_makes_bare_calls_and_says_so(client: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--nodes", "16", "--procs", "2", "--floor", "2", "--floor-client", client],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kind = "asyncio tasks" if client == "aio" else "threads"
    assert f"grpc server scale: 16 nodes (2 client processes x 8 {kind}, one channel each)" in proc.stdout
    assert f"floor: 2 bare Get call(s) per node, no rendezvous protocol ({client} clients)" in proc.stdout
    assert "release to the last node's last call:" in proc.stdout
    assert "one round" not in proc.stdout


@pytest.mark.parametrize("args", [["--floor", "-1"], ["--floor-client", "aio"]])
def test_bad_floor_arguments_exit_2(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--floor" in proc.stderr
