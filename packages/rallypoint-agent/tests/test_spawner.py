"""A signal that reaches the agent while a worker is being forked must not lose that worker."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent.logs import WorkerLogs
from rallypoint.agent.spawner import Spawner, in_thread, interruption, wait_through
from rallypoint.agent.warm import WarmLauncher
from rallypoint.agent.workers import WorkerGroup, WorkerSpec


class Interrupted(BaseException):
    """What the test's SIGUSR1 handler raises in the main thread (as the agent's AgentSignal)."""


@pytest.fixture
def interrupt_soon() -> Iterator[Callable[[float], None]]:
    """``interrupt_soon(s)``: SIGUSR1 to this process after ``s`` seconds; its handler raises Interrupted."""

    def handle(_signum: int, _frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handle)
    timers: list[threading.Timer] = []

    def arm(seconds: float) -> None:
        timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))
        timers.append(timer)
        timer.start()

    try:
        yield arm
    finally:
        for timer in timers:
            timer.join()
        signal.signal(signal.SIGUSR1, previous)


def test_wait_through_waits_out_an_interruption_and_hands_back_both(interrupt_soon: Callable[[float], None]) -> None:
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.5)
        finished.set()
        return "forked"

    interrupt_soon(0.1)
    result, interruption = wait_through(Spawner().submit(slow))
    assert finished.is_set()
    assert result == "forked"
    assert isinstance(interruption, Interrupted)


def test_wait_through_raises_the_interruption_when_the_call_failed_too(
    interrupt_soon: Callable[[float], None],
) -> None:
    def failing() -> str:
        time.sleep(0.5)
        raise OSError("no such directory")

    interrupt_soon(0.1)
    with pytest.raises(Interrupted):
        wait_through(in_thread(failing))


def test_wait_through_raises_what_the_call_raised() -> None:
    def failing() -> str:
        raise OSError("no such directory")

    with pytest.raises(OSError, match="no such directory"):
        wait_through(Spawner().submit(failing))
    assert wait_through(in_thread(lambda: 7)) == (7, None)


def test_a_worker_forked_while_a_signal_came_is_recorded_and_stopped(
    interrupt_soon: Callable[[float], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal comes while rank 0 is being forked: the group still holds it, and stop() ends it.

    The main thread used to give up waiting for the fork: the worker ran on, unknown to the group.
    """
    original = WorkerGroup._spawn

    def slow_spawn(self: WorkerGroup, spec: WorkerSpec) -> Any:
        time.sleep(0.5)  # the signal comes meanwhile
        return original(self, spec)

    monkeypatch.setattr(WorkerGroup, "_spawn", slow_spawn)
    group = WorkerGroup()
    specs = [WorkerSpec(rank=r, argv=[sys.executable, "-c", "import time; time.sleep(60)"]) for r in range(2)]
    interrupt_soon(0.1)
    with pytest.raises(Interrupted):
        group.start(specs)
    try:
        assert list(group.pids) == [0], "the forked worker was lost, or rank 1 started after the signal"
        pid = group.pids[0]
        os.kill(pid, 0)  # running
    finally:
        exits = group.stop(grace=5)
    assert exits[0].pid == pid
    assert exits[0].returncode == -signal.SIGTERM


def test_wait_through_gives_up_after_its_patience(interrupt_soon: Callable[[float], None]) -> None:
    def stuck() -> str:
        time.sleep(3)
        return "too late"

    interrupt_soon(0.1)
    started = time.monotonic()
    with pytest.raises(Interrupted):
        wait_through(in_thread(stuck), patience=0.3)
    assert time.monotonic() - started < 2.0


def test_a_signal_while_the_warm_process_imports_is_not_held_back(
    interrupt_soon: Callable[[float], None], tmp_path: Path
) -> None:
    """The agent's first start waits for the warm process's imports (torch: seconds; up to 600 s).

    A signal then must stop the agent at once; a start waited out as a whole would hold it back
    until the imports were done.
    """
    (tmp_path / "slowimport.py").write_text("import time\ntime.sleep(20)\n")
    warm = WarmLauncher(["slowimport"], env={**os.environ, "PYTHONPATH": str(tmp_path)}, console=io.StringIO())
    group = WorkerGroup(warm=warm)
    interrupt_soon(0.5)
    started = time.monotonic()
    try:
        with pytest.raises(Interrupted):
            group.start([WorkerSpec(rank=0, argv=[sys.executable, "-u", str(tmp_path / "never.py")])])
        waited = time.monotonic() - started
        assert not group.pids
    finally:
        group.stop(grace=1)
        warm.close()
    assert waited < 5.0, f"the signal waited {waited:.1f}s for the imports"


def test_a_signal_while_a_workers_logs_are_attached_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal comes while the started worker's log readers start (as the agent's SIGTERM did
    in CI). It was raised inside that step, whose clean-up killed every worker with SIGKILL at once:
    the workers never got the SIGTERM the agent forwards. Now it waits for the step to end."""

    def handle(_signum: int, _frame: Any) -> None:
        interruption(Interrupted())  # as the agent's handler does

    original = WorkerLogs.attach

    def attach_signalled(self: WorkerLogs, *args: Any) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)  # handled before this returns
        time.sleep(0.05)
        original(self, *args)

    previous = signal.signal(signal.SIGUSR1, handle)
    monkeypatch.setattr(WorkerLogs, "attach", attach_signalled)
    group = WorkerGroup(logs=WorkerLogs(tmp_path, host="h"))
    try:
        with pytest.raises(Interrupted):
            group.start([WorkerSpec(rank=0, argv=[sys.executable, "-c", "import time; time.sleep(60)"])])
        assert list(group.pids) == [0]
    finally:
        signal.signal(signal.SIGUSR1, previous)
        exits = group.stop(grace=5)  # what the agent does with the signal: SIGTERM first
    assert exits[0].returncode == -signal.SIGTERM, exits
