"""Multi-process tests launch their workers through ``rallypoint run``, as users do.

The agent gives each worker torchrun's variables and ``RALLYPOINT_COLLECTIVES_BACKEND`` /
``RALLYPOINT_COLLECTIVES_TIMEOUT`` from ``--set collectives.*``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

WORKERS = Path(__file__).parent / "workers"


@dataclass
class WorkerResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str

    def lines(self, prefix: str) -> list[str]:
        return [line[len(prefix) :].strip() for line in self.stdout.splitlines() if line.startswith(prefix)]


@dataclass
class Launch:
    """What one ``rallypoint run`` did.

    Attributes:
        workers: each rank's outcome and log.
        wall: seconds from starting the agent to its exit.
        returncode: the agent's exit status.
        stderr: the agent's stderr (its failure report, when the job failed).
        failure: the job's ``failure.json``, parsed (``None`` when the job succeeded).
    """

    workers: list[WorkerResult]
    wall: float
    returncode: int = 0
    stderr: str = ""
    failure: dict[str, Any] | None = None

    def check(self) -> None:
        bad = [w for w in self.workers if w.returncode != 0]
        if bad:
            report = "\n".join(
                f"--- rank {w.rank} exit {w.returncode}\nstdout:\n{w.stdout[-3000:]}\nstderr:\n{w.stderr[-3000:]}"
                for w in bad
            )
            raise AssertionError(f"{len(bad)} worker(s) failed:\n{report}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch_workers(
    script: str | Path,
    nprocs: int,
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    backend: str = "gloo",
    timeout: float | None = None,
    deadline: float = 90.0,
) -> Launch:
    """Run ``script`` as ``nprocs`` workers through ``rallypoint run``; collect each rank's output.

    Each rank's output is read from its log file (``<log_dir>/attempt_0/rank_R.log``, stdout and
    stderr together); a rank's return code comes from the job's ``failure.json`` (0 when the
    job succeeded). Restarts are off, so a failure is reported as it happened.
    """
    path = Path(script)
    if not path.is_absolute():
        path = WORKERS / path
    log_dir = Path(tempfile.mkdtemp(prefix="rp-coll-"))
    command = [
        sys.executable,
        "-c",
        "from rallypoint.core.cli import entrypoint; entrypoint()",
        "run",
        "--nproc-per-node",
        str(nprocs),
        "--max-restarts",
        "0",
        "--tee",
        "none",
        "--log-dir",
        str(log_dir),
        "--set",
        f"collectives.backend={backend}",
    ]
    if timeout is not None:
        command += ["--set", f"collectives.timeout={timeout}"]
    agent_env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    agent_env.update(env or {})
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [*command, str(path), *args], env=agent_env, capture_output=True, text=True, timeout=deadline
        )
        codes = {rank: 0 for rank in range(nprocs)}
        report = log_dir / "failure.json"
        failures = json.loads(report.read_text()) if report.exists() else None
        if failures is not None:
            for failure in failures["failures"]:
                codes[failure["rank"]] = failure["exit_code"] if failure["exit_code"] is not None else -1
        if proc.returncode != 0 and not any(codes.values()):
            codes = {rank: proc.returncode for rank in codes}
        results = []
        for rank in range(nprocs):
            log = log_dir / "attempt_0" / f"rank_{rank}.log"
            text = log.read_text() if log.exists() else ""
            results.append(WorkerResult(rank, codes[rank], text, proc.stderr))
        return Launch(results, time.monotonic() - start, proc.returncode, proc.stderr, failures)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


@pytest.fixture
def launch() -> Callable[..., Launch]:
    """``launch(script, nprocs, args=..., env=..., backend=..., timeout=...) -> Launch``."""
    return launch_workers


@pytest.fixture(scope="module")
def module_launch() -> Callable[..., Launch]:
    """:func:`launch` for module-scoped fixtures (one job whose results several tests check)."""
    return launch_workers
