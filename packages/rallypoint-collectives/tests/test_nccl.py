"""NCCL through the facade: runs where CUDA is visible, skips with the reason elsewhere."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from rallypoint_nccl.availability import check

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _gpus() -> int:
    availability = check()
    if not availability.available:
        pytest.skip(f"NCCL cannot run here: {availability.reason}")
    import torch

    return int(torch.cuda.device_count())


def test_every_operation_on_nccl(launch: Callable[..., Any]) -> None:
    nprocs = min(_gpus(), 2)  # NCCL needs one GPU per rank
    result = launch("ops.py", nprocs, backend="nccl")
    result.check()
    for worker in result.workers:
        assert worker.lines("RESULT") == ["ok"]
        assert "backend=nccl" in worker.lines("INFO")[0]


def test_auto_picks_nccl_with_cuda(launch: Callable[..., Any]) -> None:
    _gpus()
    result = launch("ops.py", 1, backend="auto")
    result.check()
    info = result.workers[0].lines("INFO")[0]
    assert "backend=nccl" in info
    assert "auto" in info


def test_nccl_timeout_names_the_missing_rank(launch: Callable[..., Any]) -> None:
    if _gpus() < 2:
        pytest.skip("NCCL with 2 ranks needs 2 GPUs (one per rank); this machine has 1")
    result = launch("timeouts.py", 2, args=["collective", "2.5"], backend="nccl")
    result.check()
    (seen,) = [json.loads(line) for line in result.workers[0].lines("TIMEOUT")]
    assert seen["missing"] == [1]
    assert seen["op"] == "all_reduce"
    assert 2.5 <= seen["elapsed"] < 2.5 + 8.0, seen  # fired by the facade, not NCCL's watchdog (600 s)
