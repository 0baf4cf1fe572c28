"""Idle console lanes sleep: their writer threads do not wake each other while nothing is queued.

Both lanes (the agent's stdout and stderr) share one condition. A writer with nothing to do used
to notify every waiter before it waited, so once both writer threads existed they woke each other
in turn for as long as the agent ran: about one CPU core, taken from the workers on the same host
(found by ``tools/bench/slurm_launch.py``: the workers' ``import torch`` and first step were slower
under rallypoint than under torchrun on a 2-CPU machine).
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest

from rallypoint.agent import console


class CountingCondition(threading.Condition):
    """A condition that counts how often a waiter returned from :meth:`wait`."""

    def __init__(self) -> None:
        super().__init__()
        self.wakeups = 0

    def wait(self, timeout: float | None = None) -> bool:
        woke = super().wait(timeout)
        self.wakeups += 1
        return woke


def _idle(*lanes: console.ConsoleLane, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(lane.pending() for lane in lanes):
        assert time.monotonic() < deadline, "the lanes did not write their text"
        time.sleep(0.01)


def test_two_idle_lanes_do_not_wake_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    cond = CountingCondition()
    monkeypatch.setattr(console, "_cond", cond)
    out, err = console.ConsoleLane(False), console.ConsoleLane(True)
    out.other, err.other = err, out
    sink: Any = io.StringIO()
    assert out.put("a line\n", lines=1, rank=0, where="rank_0.log", target=sink)
    assert err.put("a warning\n", lines=1, rank=0, where="rank_0.log", target=sink)
    _idle(out, err)
    time.sleep(0.2)  # both writers are back in their wait
    before = cond.wakeups
    time.sleep(1.0)
    woken = cond.wakeups - before
    assert woken <= 2, f"idle writer threads woke {woken} times in 1 s"
    # and they still write what comes next
    assert out.put("another line\n", lines=1, rank=0, where="rank_0.log", target=sink)
    _idle(out, err)
    assert sink.getvalue().count("\n") == 3
