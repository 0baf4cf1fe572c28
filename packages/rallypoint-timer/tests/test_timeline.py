"""Tests of the event recorder: nesting, callbacks, config, the log and crash safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint import timer
from rallypoint.timer import Event, Recorder, TimelineConfig, TimelineError
from rallypoint.timer.gather import get_timeline
from rallypoint.timer.merge import load_log
from rallypoint.timer.timeline import _reset_for_tests


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Recorder]:
    rec = Recorder(tmp_path / "timeline" / "rank_0.jsonl", rank=0, autoflush=False)
    _reset_for_tests(rec)
    yield rec
    _reset_for_tests(None)
    rec.close()


def names(records: list[dict[str, object]], kind: str) -> list[object]:
    return [r["name"] for r in records if r["t"] == kind]


def test_nested_events_context_manager_decorator_and_explicit(recorder: Recorder) -> None:
    @timer.event("load")
    def load(x: int) -> int:
        return x + 1

    @timer.event()
    def unnamed() -> None:
        pass

    with timer.event("step", step=1):
        timer.start_event("forward")
        assert load(1) == 2
        timer.end_event("forward")
        unnamed()
    records = recorder.records()
    assert records[0]["t"] == "meta"
    assert records[0]["rank"] == 0
    assert names(records, "B") == ["step", "forward", "load", f"{unnamed.__qualname__}"]
    assert names(records, "E") == ["load", "forward", unnamed.__qualname__, "step"]
    depth = {r["name"]: r["d"] for r in records if r["t"] == "B"}
    assert depth == {"step": 0, "forward": 1, "load": 2, unnamed.__qualname__: 1}
    assert next(r for r in records if r["t"] == "B")["args"] == {"step": 1}
    spans = {s.name: s for s in load_log(recorder.path).spans}  # type: ignore[arg-type]
    assert spans["step"].start_ns <= spans["forward"].start_ns <= spans["load"].start_ns
    assert spans["load"].end_ns <= spans["forward"].end_ns <= spans["step"].end_ns


def test_callbacks_on_start_and_end(recorder: Recorder) -> None:
    seen: list[tuple[str, Event]] = []
    timer.on_event_start(lambda e: seen.append(("start", e)))

    @timer.on_event_end
    def ended(e: Event) -> None:
        seen.append(("end", e))

    with timer.event("outer", k="v"), timer.event("inner"):
        pass
    assert [(k, e.name, e.depth) for k, e in seen] == [
        ("start", "outer", 0),
        ("start", "inner", 1),
        ("end", "inner", 1),
        ("end", "outer", 0),
    ]
    start_outer, end_outer = seen[0][1], seen[3][1]
    assert start_outer.end_ns is None
    assert start_outer.duration_s is None
    assert end_outer.args == {"k": "v"}
    assert end_outer.end_ns is not None
    assert end_outer.duration_s is not None
    assert end_outer.duration_s >= 0
    recorder.remove_callback(ended)
    with timer.event("later"):
        pass
    assert [k for k, _ in seen].count("end") == 2


def test_end_without_start_is_an_error_and_threads_are_separate(recorder: Recorder) -> None:
    with pytest.raises(TimelineError, match="without a matching start_event"):
        timer.end_event("never")
    timer.start_event("mine")
    errors: list[BaseException] = []

    def other() -> None:
        try:
            timer.end_event("mine")
        except TimelineError as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1
    timer.end_event("mine")


def test_overlapping_events_end_by_name(recorder: Recorder) -> None:
    timer.start_event("a")
    timer.start_event("b")
    timer.end_event("a")  # not the innermost: allowed, ends "a"
    timer.end_event("b")
    recorder.flush()
    spans = {s.name: s for s in load_log(recorder.path).spans}  # type: ignore[arg-type]
    assert set(spans) == {"a", "b"}
    assert not any(s.unfinished for s in spans.values())


def test_config_selects_events_and_rejects_bad_files(tmp_path: Path) -> None:
    cfg_path = tmp_path / "tl.json"
    cfg_path.write_text(json.dumps({"events": ["step", "fw*"], "exclude": ["fw_debug"], "flush_interval": 0.5}))
    cfg = TimelineConfig.load(cfg_path)
    assert cfg.flush_interval == 0.5
    rec = Recorder(None, config=cfg, autoflush=False)
    for name in ("step", "fwd", "fw_debug", "other"):
        rec.start(name)
        rec.end(name)
    assert names(rec.records(), "B") == ["step", "fwd"]
    rec.end("other")  # filtered out: no error
    for bad, message in [
        ({"flush": 1}, "unknown key 'flush'"),
        ({"flush_interval": 0}, "flush_interval: expected a positive number"),
        ({"events": [1]}, "events: expected a list"),
        ({"cuda": "yes"}, "cuda: expected true or false"),
    ]:
        cfg_path.write_text(json.dumps(bad))
        with pytest.raises(TimelineError, match=message):
            TimelineConfig.load(cfg_path)
    cfg_path.write_text("{")
    with pytest.raises(TimelineError, match="not valid JSON"):
        TimelineConfig.load(cfg_path)


def test_env_file_and_config_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "tl.json"
    cfg.write_text(json.dumps({"output": str(tmp_path / "out" / "r{rank}.jsonl")}))
    monkeypatch.setenv("RALLYPOINT_TIMELINE_CONFIG", str(cfg))
    monkeypatch.setenv("RANK", "5")
    monkeypatch.delenv("RALLYPOINT_TIMELINE_FILE", raising=False)
    rec = timer.configure_timeline()
    try:
        assert rec.path == tmp_path / "out" / "r5.jsonl"
        monkeypatch.setenv("RALLYPOINT_TIMELINE_FILE", str(tmp_path / "agent.jsonl"))
        rec = timer.configure_timeline()
        assert rec.path == tmp_path / "agent.jsonl"
        assert rec.rank == 5
    finally:
        rec.close()
        _reset_for_tests(None)


def test_in_memory_get_timeline(tmp_path: Path) -> None:
    rec = Recorder(None, rank=2, autoflush=False)
    _reset_for_tests(rec)
    try:
        with timer.event("x"):
            pass
        tl = timer.get_timeline()
        assert [(s.rank, s.name) for s in tl.spans] == [(2, "x")]
    finally:
        _reset_for_tests(None)


def test_closed_recorder_records_nothing(recorder: Recorder) -> None:
    recorder.close()
    recorder.start("late")
    recorder.end("late")
    assert names(recorder.records(), "B") == []


CRASHING_WORKER = textwrap.dedent(
    """
    import os, sys, time
    from rallypoint import timer
    for i in range(3):
        with timer.event("step", step=i):
            with timer.event("compute"):
                pass
    timer.start_event("stuck")
    log = os.environ["RALLYPOINT_TIMELINE_FILE"]

    def flushed():  # the background flush wrote "stuck" to the log
        return os.path.exists(log) and b'"name":"stuck"' in open(log, "rb").read()

    deadline = time.monotonic() + 30
    while not flushed():
        assert time.monotonic() < deadline, "the timeline was not flushed within 30 s"
        time.sleep(0.01)
    print("ready", flush=True)
    timer.start_event("never_flushed")   # recorded after the last flush: may be lost
    time.sleep(60)
    """
)


def test_worker_killed_mid_event_keeps_everything_up_to_the_last_flush(tmp_path: Path) -> None:
    cfg = tmp_path / "tl.json"
    cfg.write_text(json.dumps({"flush_interval": 0.05}))
    log = tmp_path / "attempt_0" / "timeline" / "rank_1.jsonl"
    env = {
        **os.environ,
        "RANK": "1",
        "RALLYPOINT_TIMELINE_FILE": str(log),
        "RALLYPOINT_TIMELINE_CONFIG": str(cfg),
    }
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_WORKER], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
    parsed = load_log(log)
    done = [(s.name, s.args.get("step")) for s in parsed.spans if not s.unfinished]
    assert done.count(("compute", None)) == 3
    assert [a for n, a in done if n == "step"] == [0, 1, 2]
    unfinished = [s.name for s in parsed.spans if s.unfinished]
    assert "stuck" in unfinished
    assert parsed.rank == 1
    assert parsed.bad_lines == 0
    # the merged timeline keeps the unfinished event
    tl = get_timeline(tmp_path)
    assert any(s.name == "stuck" and s.unfinished for s in tl.spans)


def test_background_flush_interval(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "r.jsonl", config=TimelineConfig(flush_interval=0.02))
    try:
        rec.start("a")
        rec.end("a")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and b'"name":"a"' not in (tmp_path / "r.jsonl").read_bytes():
            time.sleep(0.01)
        assert b'"t":"E","name":"a"' in (tmp_path / "r.jsonl").read_bytes()
    finally:
        rec.close()
