"""Real worker processes running real Gloo collectives through the facade."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("nprocs", [2, 3])
def test_every_operation_and_reduce_op(launch: Callable[..., Any], nprocs: int) -> None:
    result = launch("ops.py", nprocs)
    result.check()
    for worker in result.workers:
        assert worker.lines("RESULT") == ["ok"], worker.stdout
        checks = worker.lines("CHECK")
        for op in ("SUM", "PRODUCT", "MAX", "MIN", "AVG"):
            assert f"all_reduce {op}" in checks
            assert f"all_reduce async {op}" in checks
        assert "broadcast" in checks
        assert "scatter" in checks
        assert "barrier" in checks
        assert any(c.startswith("isend/irecv ring") for c in checks)
        assert any(c.startswith("all_gather") for c in checks)
    dst = nprocs - 1
    assert all(f"reduce {op}" in result.workers[dst].lines("CHECK") for op in ("SUM", "PRODUCT", "MAX", "MIN", "AVG"))
    assert any(c.startswith("gather [") for c in result.workers[0].lines("CHECK"))
    assert [c for c in result.workers[1].lines("CHECK") if c.startswith("send/recv order")] == [
        "send/recv order 0",
        "send/recv order 1",
        "send/recv order 2",
    ]
    assert "recv any source" in result.workers[0].lines("CHECK")
    assert any(c.startswith("sub-group all_reduce") for c in result.workers[0].lines("CHECK"))
    assert "sub-group broadcast" in result.workers[1].lines("CHECK")
    info = result.workers[0].lines("INFO")[0]
    assert "backend=gloo" in info


def _timeouts(worker: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in worker.lines("TIMEOUT")]


#: Seconds by which a timeout must fire: far above scheduling noise on a loaded 2-CPU machine,
#: far below what tells the facade's timeout from Gloo's own (the job default plus 10 s) or a hang.
LATE = 8.0


def _slow_barrier_checked(result: Any) -> None:
    for worker in result.workers:  # announced on the store while waiting, withdrawn once done
        assert "slow barrier" in worker.lines("CHECK"), worker.stdout


def test_rank_that_never_arrives_is_named(launch: Callable[..., Any]) -> None:
    timeout = 2.5
    result = launch("timeouts.py", 3, args=["collective", str(timeout)])
    result.check()
    _slow_barrier_checked(result)
    for rank in (0, 1):  # rank 1 arrives late (after rank 0 announced): it must not be named
        (seen,) = _timeouts(result.workers[rank])
        assert seen["missing"] == [2], seen
        assert seen["arrived"] == [0, 1]
        assert seen["op"] == "all_reduce"
        assert seen["group"] == "WORLD"
        assert seen["rank"] == rank
        assert seen["is_timeout_error"]
        assert timeout <= seen["elapsed"] < timeout + LATE, seen
        assert "rank 2 did not arrive" in seen["message"]
        assert "all_reduce on WORLD" in seen["message"]
    assert _timeouts(result.workers[2]) == []


def test_job_default_timeout_and_point_to_point(launch: Callable[..., Any]) -> None:
    result = launch("timeouts.py", 2, args=["default"], timeout=1.5)
    result.check()
    _slow_barrier_checked(result)
    barrier, recv = _timeouts(result.workers[0])
    assert barrier["op"] == "barrier"
    assert barrier["missing"] == [1]
    assert barrier["timeout"] == 1.5
    assert 1.5 <= barrier["elapsed"] < 1.5 + LATE, barrier
    assert recv["op"] == "recv"
    assert recv["missing"] == [1]
    assert recv["timeout"] == 1.0
    assert 1.0 <= recv["elapsed"] < 1.0 + LATE, recv


def test_torchrun_style_script_still_works(launch: Callable[..., Any]) -> None:
    result = launch("compat.py", 2, timeout=45)
    result.check()
    assert all(w.lines("RESULT") == ["ok"] for w in result.workers)
