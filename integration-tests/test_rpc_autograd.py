"""The distributed autograd examples (examples/rpc_autograd) through ``rallypoint run`` with 3 workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "rpc_autograd"
RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]


def _run(name: str, tmp_path: Path) -> dict[str, object]:
    cmd = [*RALLYPOINT, "run", "--log-dir", str(tmp_path / "logs"), "-s", f'job.args=["--out", "{tmp_path}"]']
    proc = subprocess.run([*cmd, str(EXAMPLES / f"{name}.toml")], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((tmp_path / f"{name}.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_the_seeds_training_loop_equals_a_single_process_run(tmp_path: Path) -> None:
    result = _run("train_remote", tmp_path)
    assert result["max_abs_diff"] <= 1e-6  # type: ignore[operator]
    assert result["weights_moved_by"] > 0.01  # type: ignore[operator]  # and it did train


@pytest.mark.slow
def test_a_parameter_server_with_two_trainers(tmp_path: Path) -> None:
    result = _run("param_server", tmp_path)
    for trainer in result["trainers"]:  # type: ignore[attr-defined]
        assert trainer["gradient_mismatch"] <= 1e-6  # each context held only its own trainer's gradient
        assert trainer["last_loss"] < 1e-4
    for got, true in zip(result["weight"][0], result["true_weight"][0], strict=True):  # type: ignore[index]
        assert abs(got - true) < 1e-3
    assert abs(result["bias"][0] - result["true_bias"]) < 1e-3  # type: ignore[index, operator]
    assert result["grad_left_in_dot_grad"] is False


@pytest.mark.slow
def test_a_two_stage_pipeline_of_remote_modules(tmp_path: Path) -> None:
    result = _run("pipeline", tmp_path)
    assert result["max_abs_diff"] <= 1e-6  # type: ignore[operator]
    assert result["weights_moved_by"] > 0.01  # type: ignore[operator]


@pytest.mark.slow
def test_a_worker_dying_mid_backward_is_named_and_the_context_released(tmp_path: Path) -> None:
    """Real processes and the grpc transport: worker2's process ends inside its part of the backward pass."""
    script = Path(__file__).resolve().parent / "rpc_autograd_dying.py"
    argv = [*RALLYPOINT, "run", "--nproc-per-node", "3", "--max-restarts", "0", "--run-id", "dying"]
    proc = subprocess.run(
        [*argv, "--log-dir", str(tmp_path / "logs"), str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert (tmp_path / "dying.json").exists(), proc.stdout + proc.stderr
    result = json.loads((tmp_path / "dying.json").read_text())
    assert result["worker1_contexts_before"] == 1
    assert result["error"].startswith("WorkerUnavailable: worker worker2 (rank 2, "), result["error"]
    assert result["worker1_contexts_after"] == 0  # released on the workers still alive
    assert result["worker0_contexts_after"] == 0
