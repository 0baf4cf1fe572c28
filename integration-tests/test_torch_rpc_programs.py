"""Programs written for torch.distributed.rpc give torch's results through rallypoint.rpc (#36).

Each test runs one program of ``torch_rpc_programs/programs.py`` twice, on torch's RPC and on
rallypoint's (the import block is the only switch; rallypoint runs in its torch compatibility
mode), and compares what it computed: losses, parameters.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "torch_rpc_programs"))

import programs


def _close(a: Any, b: Any, where: str = "result") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict), where
        assert a.keys() == b.keys(), where
        for key in a:
            _close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list), where
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    else:
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), f"{where}: torch {a}, rallypoint {b}"


@pytest.mark.parametrize("program", ["batch_ps", "pipeline", "ddp_remote", "rnn"])
def test_a_torch_rpc_program_gives_torchs_result_through_rallypoint(program: str) -> None:
    under_torch = programs.launch(program, "torch")
    under_rallypoint = programs.launch(program, "rallypoint")
    _close(under_torch, under_rallypoint)
    losses = under_torch["losses"] if "losses" in under_torch else under_torch["trainers"][0]["losses"]
    flat = [x for row in losses for x in row] if isinstance(losses[0], list) else losses
    assert len(set(flat)) > 1  # it trained: the loss changed between steps
