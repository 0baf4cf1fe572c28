"""``TimelineClient`` (config file + log path, nested events, callbacks) and the gathered timeline.

In-process tests; the same features in real workers through ``rallypoint run``, on one host and
on two namespace hosts, are in ``integration-tests/test_examples_issue18.py``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rallypoint import timer
from rallypoint.timer import Recorder, TimelineClient, TimelineError
from rallypoint.timer.client import rank_log_path
from rallypoint.timer.clock import sync_clocks
from rallypoint.timer.gather import gather_timeline
from rallypoint.timer.timeline import _reset_for_tests


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("RALLYPOINT_TIMELINE_FILE", "RALLYPOINT_TIMELINE_CONFIG", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield
    _reset_for_tests(None)


def test_client_from_two_files_with_nested_events_and_callbacks(tmp_path: Path) -> None:
    config = tmp_path / "timer_config.json"
    config.write_text(json.dumps({"events": ["step", "forward", "backward"], "flush_interval": 0.05}))
    started: list[tuple[str, int, dict[str, object]]] = []
    ended: list[tuple[str, float]] = []
    client = TimelineClient(
        config_path=config,
        log_path=tmp_path / "timer_events.log",
        on_event_start=lambda ev: started.append((ev.name, ev.depth, dict(ev.args))),
        on_event_end=lambda ev: ended.append((ev.name, ev.duration_s or 0.0)),
    )
    try:
        assert client.log_path == tmp_path / "timer_events.log"
        client.start_event("step", step=1)  # attributes as for event()
        with client.event("forward", micro_batch=0):
            client.start_event("debug_only")  # not in the config's events: not recorded
            client.end_event("debug_only")
        client.start_event("backward")
        client.end_event("backward")
        with timer.event("step", step=2):  # the module API records into the client's log too
            pass
        client.end_event("step")
        client.flush()
    finally:
        client.close()
    assert started == [
        ("step", 0, {"step": 1}),
        ("forward", 1, {"micro_batch": 0}),
        ("backward", 1, {}),
        ("step", 1, {"step": 2}),
    ]
    assert [name for name, _ in ended] == ["forward", "backward", "step", "step"]
    lines = [json.loads(line) for line in (tmp_path / "timer_events.log").read_text().splitlines()]
    assert lines[0]["t"] == "meta"
    begins = [(r["name"], r.get("args")) for r in lines if r["t"] == "B"]
    assert begins == [("step", {"step": 1}), ("forward", {"micro_batch": 0}), ("backward", None), ("step", {"step": 2})]


def test_module_start_event_takes_attributes(tmp_path: Path) -> None:
    rec = Recorder(None, rank=0, autoflush=False)
    _reset_for_tests(rec)
    timer.start_event("step", step=1)  # was a TypeError
    timer.start_event("inner", {"a": 1}, b=2)
    timer.end_event("inner")
    timer.end_event("step")
    begins = [r.get("args") for r in rec.records() if r["t"] == "B"]
    assert begins == [{"step": 1}, {"a": 1, "b": 2}]


def test_client_reads_the_config_the_agent_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"exclude": ["noise"]}))
    monkeypatch.setenv("RALLYPOINT_TIMELINE_CONFIG", str(config))
    monkeypatch.setenv("RALLYPOINT_TIMELINE_FILE", str(tmp_path / "agent" / "rank_0.jsonl"))
    client = TimelineClient()
    try:
        assert client.log_path == tmp_path / "agent" / "rank_0.jsonl"
        assert client.config.exclude == ("noise",)
    finally:
        client.close()
    with pytest.raises(TimelineError, match=r"missing\.json"):
        TimelineClient(config_path=tmp_path / "missing.json")


def test_one_log_path_for_several_ranks() -> None:
    assert rank_log_path("timer_events.log", 0, 1) == Path("timer_events.log")
    assert rank_log_path("timer_events.log", 1, 2) == Path("timer_events.rank1.log")
    assert rank_log_path("logs/r{rank}.jsonl", 3, 4) == Path("logs/r3.jsonl")


def test_client_without_process_group_gives_its_own_events() -> None:
    client = TimelineClient(on_event_end=None)
    try:
        with client.event("x"):
            pass
        tl = client.get_timeline()
    finally:
        client.close()
    assert [(s.rank, s.name) for s in tl.spans] == [(0, "x")]


class ThreadStore:
    """A torch-Store-like space shared by threads: set, blocking get, add, delete_key."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key: str, value: str | bytes) -> None:
        with self.cond:
            self.data[key] = value if isinstance(value, bytes) else value.encode()
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.data, timeout=10), key
            return self.data[key]

    def add(self, key: str, amount: int) -> int:
        with self.cond:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value

    def check(self, keys: list[str]) -> bool:
        with self.cond:
            return all(k in self.data for k in keys)

    def delete_key(self, key: str) -> bool:
        with self.cond:
            return self.data.pop(key, None) is not None


def test_gathered_timeline_has_every_rank_on_rank_0s_clock() -> None:
    skew = {0: 0, 1: 5_000_000_000, 2: -3_000_000_000}
    store = ThreadStore()
    recorders = {r: Recorder(None, rank=r, autoflush=False, clock=_skewed(skew[r])) for r in skew}
    results: dict[int, object] = {}

    def rank_body(r: int) -> None:
        rec = recorders[r]
        rec.start("step", {"step": 0})
        time.sleep(0.01)
        rec.end("step")
        # a prefix of its own: the clock's call counters are per process and per rank
        sync_clocks(store, rank=r, world_size=3, recorder=rec, prefix="test/clock")
        results[r] = gather_timeline(store, rank=r, world_size=3, recorder=rec, sync=False)

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in skew]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    timelines = [results[r] for r in skew]
    spans = [[(s.rank, s.name) for s in tl.spans] for tl in timelines]  # type: ignore[attr-defined]
    assert all(sorted(s) == [(0, "step"), (1, "step"), (2, "step")] for s in spans)
    starts = [s.start_ns for s in timelines[0].spans]  # type: ignore[attr-defined]
    assert max(starts) - min(starts) < 1_000_000_000  # the 5 s and -3 s skews are corrected
    assert store.data == {k: v for k, v in store.data.items() if not k.startswith("rallypoint/timeline/gather")}


def _skewed(offset: int) -> Callable[[], int]:
    return lambda: time.time_ns() + offset


def test_a_rank_calling_it_alone_gets_an_error_naming_the_others() -> None:
    store = ThreadStore()
    rec = Recorder(None, rank=0, autoflush=False)
    start = time.monotonic()
    with pytest.raises(TimelineError, match=r"rank\(s\) 1, 2 did not call it within 0.3s.*collective"):
        gather_timeline(store, rank=0, world_size=3, recorder=rec, timeout=0.3)
    assert time.monotonic() - start < 10


def test_gathered_records_are_this_process_ones(tmp_path: Path) -> None:
    log = tmp_path / "timer_events.log"
    old = {"t": "meta", "version": 1, "rank": 0, "pid": 1, "clock": "time_ns", "ts": 1}
    log.write_text(json.dumps(old) + '\n{"t":"B","name":"old_run","ts":2,"tid":1,"d":0}\n')
    before = Recorder(log, rank=0, autoflush=False)  # e.g. the process recorder, before the client
    _reset_for_tests(before)
    with timer.event("before_client"):
        pass
    before.flush()  # written before the client's header
    client = TimelineClient(log_path=log)  # same file: the first recorder is closed, then appended to
    try:
        with client.event("with_client"):
            pass
        tl = gather_timeline(ThreadStore(), rank=0, world_size=1, recorder=client.recorder, sync=False)
    finally:
        client.close()
    assert sorted(s.name for s in tl.spans) == ["before_client", "with_client"]  # not the earlier run's
