"""A signal that reaches the agent while a worker is being forked must not lose that worker."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rallypoint.agent.spawner import Spawner, in_thread, wait_through
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
