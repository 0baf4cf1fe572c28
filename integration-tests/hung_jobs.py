"""Jobs in which one rank hangs (``hang_scripts/hang.py``), run with ``rallypoint run`` on one or more hosts (#40).

The command line reaches a job only through its file rendezvous backend, as from outside the job.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import netns
import pytest
from ddp_jobs import clean_env

__all__ = ["CLI", "SCRIPT", "HungJob", "line_of"]

SCRIPT = Path(__file__).parent / "hang_scripts" / "hang.py"
CLI = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]


def line_of(text: str) -> int:
    """The line of ``hang.py`` that holds ``text``."""
    return next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


class HungJob:
    """One ``rallypoint run`` of hang.py per host, until every rank printed that it is ready."""

    def __init__(
        self,
        tmp: Path,
        mode: str,
        *,
        nproc: int,
        hosts: list[netns.Host] | None = None,
        extra: tuple[str, ...] = (),
        restarts: int = 0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.rdzv = tmp / "rdzv"
        self.run_id = f"hang-{mode}"
        self.procs: list[subprocess.Popen[str]] = []
        self.outs: list[Path] = []
        nnodes = len(hosts) if hosts else 1
        for n, host in enumerate(hosts or [None]):
            out = tmp / f"agent{n}.out"
            argv = [
                *CLI, "run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--max-restarts", str(restarts),
                "--rdzv-backend", "file", "--rdzv-endpoint", str(self.rdzv), "--run-id", self.run_id,
                "--log-dir", str(tmp / f"logs{n}"), "--monitor-interval", "0.1",
            ]  # fmt: skip
            if host is not None:
                argv += ["--local-addr", host.addr]
            argv += [*extra, str(SCRIPT), mode]
            with out.open("w") as f:
                kwargs = {
                    "cwd": tmp,
                    "env": clean_env(**(env or {})),
                    "stdout": f,
                    "stderr": subprocess.STDOUT,
                    "text": True,
                }
                proc = host.popen(argv, **kwargs) if host is not None else subprocess.Popen(argv, **kwargs)
            self.procs.append(proc)
            self.outs.append(out)
        self.world = nproc * nnodes

    def output(self) -> str:
        return "\n".join(out.read_text() for out in self.outs)

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.output()
            if all(f"rank {r} ready" in text for r in range(self.world)):
                time.sleep(1.0)  # the others reach the fourth all_reduce
                return
            assert all(p.poll() is None for p in self.procs), f"the job ended early:\n{text}"
            time.sleep(0.2)
        pytest.fail(f"the job did not start in {timeout}s:\n{self.output()}")

    def stacks(self, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
        argv = [*CLI, "debug", "stacks", "--rdzv-backend", "file", "--rdzv-endpoint", str(self.rdzv)]
        started = time.monotonic()
        done = subprocess.run(
            [*argv, "--run-id", self.run_id, *args], capture_output=True, text=True, timeout=30, check=False
        )
        return done, time.monotonic() - started

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
