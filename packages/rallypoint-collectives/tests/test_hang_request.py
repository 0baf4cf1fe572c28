"""A timed-out call asks the agent for the hang report before it raises (issue #40)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from rallypoint.collectives.errors import CollectiveTimeout
from rallypoint.collectives.hang_request import DEBUG_DIR_ENV, ask_agent

ERR = CollectiveTimeout(
    op="all_reduce", group="WORLD", group_ranks=[0, 1, 2], missing=[1], arrived=[0, 2], rank=2, timeout=3.0
)


def test_without_an_agent_nothing_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEBUG_DIR_ENV, raising=False)
    started = time.monotonic()
    assert ask_agent(ERR) is None
    assert time.monotonic() - started < 1.0


def test_the_request_names_the_call_and_the_answer_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(DEBUG_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "2")
    request = tmp_path / "rank_2.hang"

    def agent() -> None:  # answers once it sees the request, as the agent's hang watch does
        deadline = time.monotonic() + 10
        while not request.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        (tmp_path / "rank_2.hang.done").write_text(json.dumps({"diagnosis": "diagnosis: rank 1 never entered it"}))

    thread = threading.Thread(target=agent)
    thread.start()
    assert ask_agent(ERR, wait=10) == "diagnosis: rank 1 never entered it"
    thread.join()
    why = json.loads(request.read_text())["why"]
    assert why == "rank 2: CollectiveTimeout in all_reduce on WORLD after 3s: rank(s) 1 did not arrive"
    assert "rallypoint: hang report of every worker (agent log dir, hang_report.txt): diagnosis: rank 1" in (
        capsys.readouterr().err
    )
    assert ask_agent(ERR, wait=0) == "diagnosis: rank 1 never entered it"  # a second timeout: already answered


def test_an_agent_that_does_not_answer_keeps_the_call_waiting_no_longer_than_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEBUG_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    started = time.monotonic()
    assert ask_agent(ERR, wait=0.3) is None
    assert 0.3 <= time.monotonic() - started < 5
    assert (tmp_path / "rank_0.hang").exists()
