"""End to end: a minimal fake agent runs the watchdog server and real worker processes.

The agent side does what ``rallypoint run`` does with ``[timer] watchdog``: it loads the backend
through the plugin registry, starts the server in the run directory, adds ``worker_env`` to each
worker's environment, and on expiry kills the worker's process group, records a failure naming
scope, deadline and rank, then restarts the worker or fails per its restart budget.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rallypoint.core.plugins import get_plugin_manager
from rallypoint.timer import Expiry, WatchdogServer
from rallypoint.timer.records import TIMER_BACKENDS

# Hangs past its timer in attempt 0; finishes well in time in later attempts (a generous timer,
# so that a loaded machine cannot make a healthy attempt miss it).
WORKER = textwrap.dedent(
    """
    import os, sys, time
    from rallypoint import timer

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with timer.expires(after=60, scope="warmup"):
        pass
    with timer.expires(after=0.3 if attempt == 0 else 60, scope="data_load"):
        print("loading", flush=True)
        if attempt == 0:
            time.sleep(120)
    print("done", flush=True)
    """
)


@dataclass
class Failure:
    rank: int
    attempt: int
    exit_code: int
    expiry: Expiry | None


@dataclass
class FakeAgent:
    server: WatchdogServer
    rank: int = 1
    max_restarts: int = 1
    failures: list[Failure] = field(default_factory=list)
    _procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    _expiries: dict[int, Expiry] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_expiry(self, expiry: Expiry) -> None:
        with self._lock:
            self._expiries[expiry.pid] = expiry
        os.killpg(expiry.pid, signal.SIGKILL)  # the worker leads its own process group

    def run(self, script: str) -> str:
        """Run the worker, restarting it per the budget; return 'succeeded' or 'failed'."""
        self.server.set_expiry_handler(self.on_expiry)
        for attempt in range(self.max_restarts + 1):
            env = {
                **os.environ,
                "RANK": str(self.rank),
                "WORLD_SIZE": "2",
                "TORCHELASTIC_RESTART_COUNT": str(attempt),
                **self.server.worker_env(self.rank),
            }
            proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
            code = proc.wait(30)
            if code == 0:
                return "succeeded"
            with self._lock:
                expiry = self._expiries.get(proc.pid)
            self.failures.append(Failure(self.rank, attempt, code, expiry))
        return "failed"


@pytest.fixture(params=["local", "file"])
def server(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    record = get_plugin_manager(autoload=False).registry(TIMER_BACKENDS).get(request.param)
    backend = record.load()
    srv = backend.start_server(tmp_path, record.options_model())
    yield srv
    srv.stop()


def test_stuck_worker_is_killed_reported_by_scope_and_restarted(server: WatchdogServer) -> None:
    agent = FakeAgent(server, max_restarts=1)
    started = time.time()
    assert agent.run(WORKER) == "succeeded"
    assert len(agent.failures) == 1
    failure = agent.failures[0]
    assert failure.exit_code == -signal.SIGKILL
    assert failure.expiry is not None
    assert (failure.expiry.scope, failure.expiry.rank) == ("data_load", 1)
    assert started < failure.expiry.deadline < time.time()
    # the deadline is taken just before the acquire time stamp, in the worker
    assert 0.3 - 0.1 < failure.expiry.deadline - failure.expiry.acquired_at <= 0.3 + 1e-6
    assert "'data_load'" in failure.expiry.describe()


def test_stuck_worker_fails_the_job_without_budget(server: WatchdogServer) -> None:
    agent = FakeAgent(server, max_restarts=0, rank=0)
    assert agent.run(WORKER) == "failed"
    [failure] = agent.failures
    assert failure.expiry is not None
    assert (failure.expiry.scope, failure.expiry.rank, failure.exit_code) == ("data_load", 0, -signal.SIGKILL)


def test_torch_file_timer_client_works_against_the_file_server(tmp_path: Path) -> None:
    record = get_plugin_manager(autoload=False).registry(TIMER_BACKENDS).get("file")
    server = record.load().start_server(tmp_path, None)
    agent = FakeAgent(server, max_restarts=0, rank=3)
    script = textwrap.dedent(
        """
        import os, time
        from torch.distributed.elastic.timer import FileTimerClient, configure, expires
        configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        with expires(after=0.3, scope="torch_scope"):
            time.sleep(60)
        """
    )
    server.set_expiry_handler(agent.on_expiry)
    env = {**os.environ, **server.worker_env(3)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    server.register_worker(proc.pid, 3)
    try:
        assert proc.wait(60) == -signal.SIGKILL
        expiry = agent._expiries[proc.pid]
        assert (expiry.scope, expiry.rank) == ("torch_scope", 3)
    finally:
        server.stop()
