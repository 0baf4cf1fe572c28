"""The flight record of collectives started with ``async_op=True`` and of point-to-point calls (#40).

A record of an asynchronous call is completed when its work completes (its future's callback
stamps the end time), whether the script waits for it, polls it, or goes through the facade;
one whose work never completes stays in flight. Two workers of ``rallypoint run`` run
``hang_scripts/async_flight.py``; the flight files are read after the job.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from ddp_jobs import clean_env
from hung_jobs import CLI

from rallypoint.agent.debug_flight import read_flight

SCRIPT = Path(__file__).parent / "hang_scripts" / "async_flight.py"


def _by_length(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["shape"][0]: r for r in records if len(r["shape"]) == 1}


def test_async_collectives_are_completed_when_their_work_completes(tmp_path: Path) -> None:
    argv = [
        *CLI, "run", "--nproc-per-node", "2", "--max-restarts", "0", "--log-dir", str(tmp_path / "logs"),
        "--set", "collectives.backend=gloo", str(SCRIPT), str(tmp_path / "rank0.pid"),
    ]  # fmt: skip
    done = subprocess.run(argv, env=clean_env(), cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    debug = tmp_path / "logs" / "attempt_0" / "debug"
    for rank in (0, 1):
        steps = _by_length(read_flight(debug / f"rank_{rank}.flight"))
        for length, op in ((1, "all_reduce"), (2, "broadcast"), (3, "all_reduce"), (4, "all_reduce")):
            record = steps[length]
            assert record["op"] == op, (rank, record)
            assert isinstance(record["end"], float), f"rank {rank}, step {length}: {record}"
            assert 0 <= record["duration"] < 60, (rank, record)
    for rank, (first, second) in enumerate([("send", "irecv"), ("recv", "isend")]):
        steps = _by_length(read_flight(debug / f"rank_{rank}.flight"))
        got = [(steps[n]["op"], steps[n]["peer"], steps[n]["tag"], steps[n]["seq"]) for n in (5, 6)]
        assert got == [(first, 1 - rank, 0, 0), (second, 1 - rank, 3, 0)], (rank, steps[5], steps[6])
        assert all(isinstance(steps[n]["end"], float) for n in (5, 6)), (rank, steps[5], steps[6])
        assert all(steps[n]["bytes"] == 4 * n for n in (5, 6))
    never = _by_length(read_flight(debug / "rank_0.flight"))[7]
    assert never["op"] == "all_reduce"
    assert never["end"] is None  # in flight: its work never completed
    assert never["duration"] is None
    assert 7 not in _by_length(read_flight(debug / "rank_1.flight"))
