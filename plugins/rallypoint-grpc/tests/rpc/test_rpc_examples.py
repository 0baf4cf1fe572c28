"""The RPC examples (examples/rpc) run through ``rallypoint run`` with 3 workers, and their results hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[4] / "examples" / "rpc"
RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]


def _run(name: str, tmp_path: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    cmd = [*RALLYPOINT, "run", "--log-dir", str(tmp_path / "logs"), "-s", f'job.args=["--out", "{tmp_path}"]']
    proc = subprocess.run([*cmd, str(EXAMPLES / f"{name}.toml")], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((tmp_path / f"{name}.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_the_remote_counter_of_the_seeds(tmp_path: Path) -> None:
    result = _run("counter", tmp_path)
    assert result["owner"] == ["worker1", 1]
    assert result["after_add"] == [3.0, 3.0]  # ones + 2
    assert result["after_worker2"] == [5.0, 5.0]  # worker2 added 2 through the same RRef
    assert result["note"] == "worker2 added through an RRef owned by worker1"


@pytest.mark.slow
def test_the_remote_counter_runs_where_numpy_is_not_installed(tmp_path: Path) -> None:
    # numpy is not a dependency of torch: every process of the job sees it missing, as on a clean install
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text('import sys\nsys.modules["numpy"] = None\n')
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    check = subprocess.run(
        [sys.executable, "-c", "import torch; torch.ones(1).numpy()"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert "Numpy is not available" in check.stderr  # the simulation holds

    result = _run("counter", tmp_path, env={**os.environ, "PYTHONPATH": path})

    assert result["after_add"] == [3.0, 3.0]
    assert result["after_worker2"] == [5.0, 5.0]


@pytest.mark.slow
def test_data_shared_by_rrefs(tmp_path: Path) -> None:
    result = _run("shared", tmp_path)
    assert result["sums"] == [sum(range(500)), sum(range(500, 1000))]
    assert result["total"] == result["expected"] == sum(range(1000))
    assert result["table_owner"] == "worker1"
    assert result["relayed"] == 49  # worker0 -> worker2 -> worker1: still worker1's table
    assert result["fetched_by_worker0"] == 9


@pytest.mark.slow
def test_the_parameter_server_matches_a_single_process_run(tmp_path: Path) -> None:
    result = _run("param_server", tmp_path)
    assert result["weights"] == result["single_process"]
    assert result["max_abs_diff"] == 0.0
    for got, true in zip(result["weights"], result["true_weights"], strict=True):  # type: ignore[call-overload]
        assert abs(got - true) < 0.01  # and it learned the weights
