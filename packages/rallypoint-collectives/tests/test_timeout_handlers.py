"""Timeout handlers (process-wide and ``on_timeout=``) and shared deadlines, in real workers.

The workers run through ``rallypoint run`` (``workers/handlers.py``); what is asserted is what a
training script sees: which ranks the handler is told are missing, whether the call completes
after the handler waited more, what the error says about a spent deadline, and the exit status
chosen by a handler.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

import rallypoint.collectives as rc
from rallypoint.collectives.timeouts import TimeoutEvent, decide

#: Slack over a timeout for a loaded machine (the diagnosis itself reads the store for 0.5 s).
LATE = 8.0


def _results(worker: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for line in worker.lines("RESULT"):
        name, _, payload = line.partition(" ")
        out[name] = json.loads(payload)
    return out


@pytest.fixture(scope="module")
def scenarios(module_launch: Callable[..., Any]) -> dict[str, dict[str, Any]]:
    launched = module_launch("handlers.py", 3, args=["scenarios"], timeout=60, deadline=150)
    launched.check()
    return _results(launched.workers[0])


def test_a_handler_that_waits_more_lets_a_late_rank_arrive(scenarios: dict[str, dict[str, Any]]) -> None:
    wait = scenarios["wait"]
    (event,) = wait["events"]
    assert event["op"] == "barrier"
    assert event["group"] == "WORLD"
    assert event["missing"] == [1]
    assert event["arrived"] == [0, 2]
    assert event["timeout"] == 1
    assert 1 <= event["elapsed"] < 1 + LATE, event
    assert event["attempt"] == 1
    assert event["can_wait_more"] is True
    assert event["error_is_timeout"] is True
    assert event["broken_in_handler"] is False  # not marked broken while the handler decides
    assert wait["broken"] is False  # nor after the call completed
    assert wait["sum"] == [3.0, 3.0]  # the group still works
    assert wait["elapsed"] >= 1


def test_receives_share_one_deadline(scenarios: dict[str, dict[str, Any]]) -> None:
    budget = scenarios["budget"]
    assert budget["closed_before"] is False
    assert budget["closed"] is True
    assert budget["got"] == [1.0, 2.0]
    assert [w[0] for w in budget["waits"]] == ["recv from rank 1", "recv from rank 2"]
    assert not any(w[2] for w in budget["waits"])
    assert budget["timed_out"] is False
    used = sum(w[1] for w in budget["waits"])
    assert 30 - used - LATE <= budget["remaining"] <= 30 - used


def test_a_handler_may_wait_more_only_once(scenarios: dict[str, dict[str, Any]]) -> None:
    twice = scenarios["twice"]
    first, second = twice["events"]
    assert (first["attempt"], first["can_wait_more"]) == (1, True)
    assert (second["attempt"], second["can_wait_more"]) == (2, False)
    assert first["missing"] == second["missing"] == [1]
    assert second["elapsed"] >= 1.5
    assert 1.5 <= twice["elapsed"] < 1.5 + LATE
    assert "barrier on WORLD (ranks 0-2) timed out after 1.5s" in twice["message"]  # 1 s + 0.5 s more
    assert "rank 1 did not arrive" in twice["message"]


def test_a_spent_deadline_says_what_each_wait_used(scenarios: dict[str, dict[str, Any]]) -> None:
    spent = scenarios["spent"]
    assert spent["timed_out"] is True
    assert 1.5 <= spent["elapsed"] < 1.5 + LATE
    message = spent["message"]
    assert "recv on WORLD" in message
    assert "rank 2 did not arrive" in message
    assert "deadline of 1.5s shared by 2 wait(s): recv from rank 1 " in message, message
    assert "recv from rank 2 " in message, message
    assert "(ran out)" in message, message
    (event,) = spent["events"]  # Gloo closed the pair: waiting more is refused, the error raised
    assert event["can_wait_more"] is False
    assert event["deadline"] == 1.5
    waits = spent["waits"]
    assert [w[0] for w in waits] == ["recv from rank 1", "recv from rank 2"]
    assert [w[2] for w in waits] == [False, True]


def test_a_handler_can_end_the_process_with_its_code(launch: Callable[..., Any]) -> None:
    launched = launch("handlers.py", 2, args=["exit"], timeout=60, deadline=150)
    assert launched.returncode != 0
    assert launched.failure is not None, launched.stderr
    root = launched.failure["root_cause"]
    assert root["rank"] == 0, launched.failure
    assert root["exit_code"] == 7, launched.failure
    rank0 = launched.workers[0]
    assert "The timeout handler ends the process (exit 7)" in rank0.stdout, rank0.stdout
    assert "rank 1 did not arrive" in rank0.stdout
    (started,) = rank0.lines("TIMING_OUT")
    # promptly: the group was marked broken (otherwise the exit waits for Gloo's own timeout, 70 s)
    assert root["time"] - float(started) < 30


# ------------------------------------------------------------------------------------------------
# Without processes: the Deadline object and the decision rules


def test_deadline_counts_from_close_or_first_use() -> None:
    d = rc.Deadline(10)
    assert d.timeout == 10
    assert not d.closed
    assert d.remaining() == 10
    assert not d.is_timed_out()
    assert d.close() is d
    assert d.closed
    first = d.elapsed()
    d.close()  # a second close does not restart the clock
    assert d.elapsed() >= first
    assert 0 < d.remaining() <= 10
    zero = rc.Deadline(0).close()
    assert zero.is_timed_out()
    assert zero.remaining() == 0
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="Deadline"):
            rc.Deadline(bad)


def test_deadline_describes_its_waits() -> None:
    d = rc.Deadline(10)
    d.record("recv from rank 1", 0.25)
    d.record("recv from rank 2", 9.75, True)
    assert (
        d.describe() == "deadline of 10s shared by 2 wait(s): recv from rank 1 0.25s, recv from rank 2 9.75s (ran out)"
    )


def _event(can_wait_more: bool = True, attempt: int = 1) -> TimeoutEvent:
    err = rc.CollectiveTimeout(
        op="barrier", group="WORLD", group_ranks=[0, 1], missing=[1], arrived=[0], rank=0, timeout=1
    )
    return TimeoutEvent("barrier", "WORLD", (0, 1), (1,), (0,), 0, 1.0, 1.0, None, attempt, can_wait_more, err)


def test_decisions() -> None:
    previous = rc.set_timeout_handler(None)
    try:
        assert decide(_event(), None) is None  # no handler: raise
        assert decide(_event(), lambda ev: None) is None
        assert decide(_event(), lambda ev: rc.RaiseTimeout()) is None
        assert decide(_event(), lambda ev: rc.WaitMore(2.5)) == 2.5
        assert decide(_event(can_wait_more=False), lambda ev: rc.WaitMore(2.5)) is None
        with pytest.raises(SystemExit) as ended:
            decide(_event(), lambda ev: rc.ExitProcess(3))
        assert ended.value.code == 3
        with pytest.raises(TypeError, match="expected RaiseTimeout"):
            decide(_event(), lambda ev: 5)  # type: ignore[arg-type,return-value]
        rc.set_timeout_handler(lambda ev: rc.WaitMore(1))
        assert decide(_event(), None) == 1  # the process-wide handler
        assert decide(_event(), lambda ev: None) is None  # the call's own wins
        with pytest.raises(ValueError, match="WaitMore"):
            rc.WaitMore(0)
        with pytest.raises(TypeError):
            rc.set_timeout_handler(42)  # type: ignore[arg-type]
    finally:
        rc.set_timeout_handler(previous)


def test_importing_the_timeout_api_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, rallypoint.collectives as rc; rc.Deadline(1); rc.set_timeout_handler(None); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_deadline_on_collectives_and_async_work_in_one_process() -> None:
    import socket

    import torch

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    rc.init("gloo", timeout=30, rank=0, world_size=1, master_addr="127.0.0.1", master_port=port, environ={})
    try:
        deadline = rc.Deadline(20)
        rc.barrier(timeout=deadline)  # the first call starts the clock
        assert deadline.closed
        t = rc.all_reduce(torch.ones(3), timeout=deadline)
        assert t.tolist() == [1.0, 1.0, 1.0]
        work = rc.all_reduce(torch.ones(1), async_op=True, timeout=deadline)
        assert work.wait() is True
        assert [w.what for w in deadline.waits] == ["barrier on WORLD", "all_reduce on WORLD", "all_reduce on WORLD"]
        assert not deadline.is_timed_out()
        assert 0 < deadline.remaining() <= 20
        with pytest.raises(
            TypeError, match=r"all_reduce: timeout= must be seconds, a rallypoint\.collectives\.Deadline"
        ):
            rc.all_reduce(torch.ones(1), timeout="5s")  # type: ignore[arg-type]
    finally:
        rc.destroy()
