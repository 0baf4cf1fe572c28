"""Clock-offset estimation: injected skew (fake clocks) is recovered and the merged order is true."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rallypoint.timer import Recorder, sync_clocks
from rallypoint.timer.clock import ClockEstimate, estimate_offset
from rallypoint.timer.merge import load_log, merge_logs

SKEW_NS = {0: 0, 1: 3_000_000_000, 2: -2_000_000_000, 3: 500_000_000}


class ThreadStore:
    """A torch-Store-like key-value space shared by threads, with a symmetric network delay."""

    def __init__(self, delay: float = 0.0002) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.delay = delay

    def set(self, key: str, value: str) -> None:
        time.sleep(self.delay)
        with self.cond:
            self.data[key] = value.encode()
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.data, timeout=10), key
            value = self.data[key]
        time.sleep(self.delay)
        return value

    def delete_key(self, key: str) -> bool:
        with self.cond:
            return self.data.pop(key, None) is not None


def skewed(rank: int) -> Callable[[], int]:
    return lambda: time.time_ns() + SKEW_NS[rank]


def run_ranks(store: object, recorders: dict[int, Recorder]) -> dict[int, ClockEstimate]:
    results: dict[int, ClockEstimate] = {}
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            results[rank] = sync_clocks(store, rank=rank, world_size=len(recorders), rounds=6, recorder=recorders[rank])  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in recorders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return results


def test_estimate_offset_picks_the_fastest_round_trip() -> None:
    # true offset +100; the slow sample (asymmetric delay) would say otherwise
    samples = [(0, 150, 150, 100), (1000, 1300, 1300, 1400)]
    offset, uncertainty, delay = estimate_offset(samples)
    assert (offset, uncertainty, delay) == (100, 50, 100)
    with pytest.raises(ValueError, match="no round trips"):
        estimate_offset([])


def test_injected_skew_is_recovered_and_the_merged_order_is_true(tmp_path: Path) -> None:
    recorders = {
        r: Recorder(tmp_path / "attempt_0" / "timeline" / f"rank_{r}.jsonl", rank=r, clock=skewed(r), autoflush=False)
        for r in SKEW_NS
    }
    # The true order of events: rank 1, 3, 0, 2 (10 ms apart). Raw timestamps disagree with it.
    true_order = [1, 3, 0, 2]
    for r in true_order:
        recorders[r].start(f"e{r}")
        recorders[r].end(f"e{r}")
        time.sleep(0.01)
    raw = sorted(true_order, key=lambda r: recorders[r].records()[-1]["ts"])  # type: ignore[arg-type,return-value]
    assert raw != true_order

    estimates = run_ranks(ThreadStore(), recorders)
    for r, est in estimates.items():
        assert est.rank == r
        # offset maps local time onto rank 0's: the negated skew, within the stated uncertainty
        assert abs(est.offset_ns + SKEW_NS[r]) <= est.uncertainty_ns + 2_000_000, est
        assert est.uncertainty_ns < 5_000_000
    for rec in recorders.values():
        rec.close()

    log1 = load_log(tmp_path / "attempt_0" / "timeline" / "rank_1.jsonl")
    assert log1.offset_ns == estimates[1].offset_ns
    assert log1.uncertainty_ns == estimates[1].uncertainty_ns
    timeline = merge_logs([tmp_path])
    assert [s.rank for s in timeline.spans] == true_order
    assert timeline.ranks == [0, 1, 2, 3]


def test_real_torch_tcp_store(tmp_path: Path) -> None:
    from torch.distributed import TCPStore

    master = TCPStore("127.0.0.1", 0, 3, True, wait_for_workers=False)
    stores = {0: master, **{r: TCPStore("127.0.0.1", master.port, 3, False) for r in (1, 2)}}
    recorders = {r: Recorder(None, rank=r, clock=skewed(r), autoflush=False) for r in range(3)}
    results: dict[int, ClockEstimate] = {}

    def one(rank: int) -> None:
        results[rank] = sync_clocks(stores[rank], rank=rank, world_size=3, recorder=recorders[rank])

    threads = [threading.Thread(target=one, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(results) == {0, 1, 2}
    for r in (1, 2):
        assert abs(results[r].offset_ns + SKEW_NS[r]) <= results[r].uncertainty_ns + 2_000_000
        clock_lines = [x for x in recorders[r].records() if x["t"] == "clock"]
        assert clock_lines[-1]["offset_ns"] == results[r].offset_ns
        assert clock_lines[-1]["uncertainty_ns"] == results[r].uncertainty_ns


def test_sync_clocks_without_a_store_or_process_group_says_what_to_do() -> None:
    with pytest.raises(RuntimeError, match="initialise the process group first"):
        sync_clocks(recorder=Recorder(None, autoflush=False))
