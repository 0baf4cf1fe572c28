"""tools/bench/grpc_stream_floor.py: every simulated node gets its own reply, once all have joined."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "grpc_stream_floor.py"


@pytest.mark.slow
def test_a_small_streamed_round_answers_each_node_once_with_its_rank(tmp_path: Path) -> None:
    data = tmp_path / "floor.json"
    cmd = [sys.executable, str(SCRIPT), "--nodes", "8,24", "--procs", "3", "--json", str(data)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stream floor N=24 (3 client processes): release to last reply" in proc.stdout
    rounds = json.loads(data.read_text())["rounds"]
    assert [r["nodes"] for r in rounds] == [8, 24]
    for r in rounds:
        assert r["wall_s"] > 0
        assert 50 < r["bytes_received_per_node"] < 1000  # one small reply (and its framing), whatever N


def test_bad_counts_exit_2() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--nodes", "0,8"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--nodes" in proc.stderr
