"""The hang watch (issue #40): no progress for ``[debug] hang_timeout``, and workers asking for the report.

Real flight files, written by the workers' hooks; a fake clock, group and debug service: the
process-level behaviour (every node's report) is tested in ``integration-tests/test_hang_reports.py``.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import types
from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent import worker_main
from rallypoint.agent.debug_flight import FlightMark
from rallypoint.agent.hang_watch import ANSWER_WAIT, HangWatch
from rallypoint.agent.workers import WorkerExit
from rallypoint.rendezvous.keyspace import debug_hang_claim_key
from rallypoint.rendezvous.memory import MemoryBackend

HOOKS = Path(worker_main.PATH).with_name("debug_hooks.py")


def load_hooks() -> types.ModuleType:
    """The workers' hooks module, loaded by path as ``worker_main`` loads it."""
    spec = importlib.util.spec_from_file_location("_test_hang_hooks", HOOKS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Tensor:
    shape = (4,)
    dtype = "torch.float32"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Group:
    """Two running workers, ranks 0 and 1; records the signals sent to their process groups."""

    def __init__(self) -> None:
        self.pids = {0: 1000, 1: 1001}
        self.exited: set[int] = set()
        self.signals: list[int] = []

    def running(self) -> list[int]:
        return [r for r in self.pids if r not in self.exited]

    def forward_signal(self, sig: int) -> None:
        self.signals.append(sig)


DIAGNOSIS = "diagnosis: rank 0 waits in all_reduce #1; rank 1 never entered it: f at x.py:3"


class Debug:
    def __init__(self) -> None:
        self.hangs: list[str] = []

    def report_hang(self, why: str, say: Any) -> str:
        self.hangs.append(why)
        return DIAGNOSIS


class Node:
    """One node's hang watch over two workers whose hooks write real flight files."""

    def __init__(
        self,
        tmp: Path,
        backend: MemoryBackend,
        node_id: str = "n0",
        *,
        timeout: float = 5.0,
        progress: dict[int, tuple[Path, ...]] | None = None,
    ) -> None:
        hooks = load_hooks()
        self.attempt = tmp / node_id / "attempt_0"
        (self.attempt / "debug").mkdir(parents=True)
        self.flights = [hooks.FlightRecorder(str(self.attempt / "debug" / f"rank_{r}.flight")) for r in (0, 1)]
        self.clock, self.group, self.debug = Clock(), Group(), Debug()
        self.said: list[str] = []
        self.published: list[Any] = []
        self.watch = HangWatch(
            timeout,
            self.debug,
            backend,
            node_id,
            f"host-{node_id}",
            self.said.append,
            self.published.append,
            self.clock,
        )
        self.watch.follow(self.group, 7, self.attempt, progress or {}, self.failure_of)  # type: ignore[arg-type]

    @staticmethod
    def failure_of(ex: WorkerExit) -> Any:
        return types.SimpleNamespace(rank=ex.rank, pid=ex.pid, time=ex.exited_at)

    def collective(self, rank: int) -> None:
        offset = self.flights[rank].begin(b"all_reduce", None, Tensor())
        self.flights[rank].end(offset, False)

    def tick(self, seconds: float) -> None:
        self.clock.now += seconds
        self.watch.check()


def test_start_up_is_not_judged_then_no_progress_for_the_timeout_fails_the_attempt(tmp_path: Path) -> None:
    node = Node(tmp_path, MemoryBackend(tmp_path.name))
    node.tick(0)
    node.tick(60)  # no collective yet: starting up (imports, a checkpoint), never a hang
    assert node.group.signals == []
    node.collective(0)
    node.tick(1)  # the clock starts
    node.tick(4.9)
    assert node.group.signals == []
    node.tick(0.2)  # 5.1 s without progress
    assert node.group.signals == [signal.SIGKILL]  # both workers' process groups
    assert len(node.debug.hangs) == 1
    assert node.debug.hangs[0].startswith("no progress for 5s on host-n0 ([debug] hang_timeout")
    # published before the kill, dated when the hang was seen, with the diagnosis in the reason
    assert [f.rank for f in node.published] == [0, 1]
    reason, at = node.watch.explain(WorkerExit(1, 1001, -9, 0.0, at := node.published[1].time + 2))  # type: ignore[misc]
    assert reason == (
        "no progress for 5s ([debug] hang_timeout), killed (signal SIGKILL); hang diagnosis: rank 0 waits in "
        "all_reduce #1; rank 1 never entered it: f at x.py:3"
    )
    assert at == node.published[1].time
    node.tick(10)
    assert len(node.debug.hangs) == 1  # once per attempt


def test_any_worker_that_starts_or_completes_a_collective_is_progress(tmp_path: Path) -> None:
    node = Node(tmp_path, MemoryBackend(tmp_path.name))
    node.collective(0)
    for _ in range(6):  # 24 s, one collective of rank 1 every 4 s: never 5 s without progress
        node.tick(4)
        node.collective(1)
    offset = node.flights[1].begin(b"all_reduce", None, Tensor())  # a long collective: started...
    node.tick(4)
    node.tick(4)
    node.flights[1].end(offset, False)  # ...and completed 8 s later: progress again
    node.tick(0.5)
    node.tick(4)
    assert node.group.signals == []
    assert node.watch.explain(WorkerExit(1, 1001, 1, 0.0, 1.0)) is None  # not a hang


class Work:
    """An asynchronous call's work handle (the hooks wrap its class's wait and is_completed)."""

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def test_an_asynchronous_collective_that_completes_behind_a_later_one_is_progress(tmp_path: Path) -> None:
    node = Node(tmp_path, MemoryBackend(tmp_path.name))
    flight = node.flights[1]
    node.collective(0)
    work = Work()
    flight.begin(b"all_reduce", None, Tensor())  # async_op=True: it returned its work
    flight.end_with(work, flight.count - 1)
    flight.begin(b"barrier", None, None)  # then a call that waits (its record is the last one)
    node.tick(4)
    node.tick(4)
    work.wait()  # the all_reduce is waited for 8 s later (another thread): not the last record, still progress
    node.tick(0.5)
    node.tick(4)
    assert node.group.signals == []
    node.tick(1)  # 5.5 s since
    assert node.group.signals == [signal.SIGKILL]


def test_a_progress_file_that_grows_is_progress_without_any_collective(tmp_path: Path) -> None:
    # a ProgressFile (the timer's timeline) of rank 1: a worker writing events is not hung
    timeline = tmp_path / "rank_1.jsonl"
    node = Node(tmp_path, MemoryBackend(tmp_path.name), progress={1: (timeline,)})
    node.collective(0)
    node.tick(0)
    for step in range(6):  # 24 s without a collective, one event every 4 s
        node.tick(4)
        with timeline.open("a") as f:
            f.write(f'{{"step": {step}}}\n')
    node.tick(0.1)  # sees the last event
    assert node.group.signals == []
    node.tick(5.1)  # the events stop too
    assert node.group.signals == [signal.SIGKILL]


def test_a_node_that_sees_the_hang_second_leaves_the_report_to_the_first(tmp_path: Path) -> None:
    backend = MemoryBackend(tmp_path.name)
    first, second = Node(tmp_path, backend, "n0"), Node(tmp_path, backend, "n1")
    for node in (first, second):
        node.collective(0)
        node.tick(0)
    first.tick(6)
    second.tick(6)
    assert first.group.signals == [signal.SIGKILL]
    assert second.group.signals == []  # its workers end with the round (or fail when their peers die)
    assert second.debug.hangs == []
    assert "node 'n0' saw the hang first and gathers the report" in second.said[-1]
    claim = backend.get(debug_hang_claim_key(7))
    assert claim is not None
    assert claim.value["diagnosis"].startswith("diagnosis: rank 0 waits")  # for the others' workers


def ask(node: Node, rank: int, why: str) -> Path:
    request = node.attempt / "debug" / f"rank_{rank}.hang"
    request.write_text(json.dumps({"why": why, "time": 0}))
    return request.with_name(request.name + ".done")


def test_a_worker_that_asks_gets_the_report_gathered_and_its_failure_carries_the_diagnosis(tmp_path: Path) -> None:
    node = Node(tmp_path, MemoryBackend(tmp_path.name), timeout=0.0)  # hang_timeout off: requests are still served
    node.tick(0)
    answer = ask(node, 1, "rank 1: CollectiveTimeout in all_reduce on WORLD after 3s: rank(s) 0 did not arrive")
    node.tick(0.1)
    assert node.debug.hangs == ["rank 1: CollectiveTimeout in all_reduce on WORLD after 3s: rank(s) 0 did not arrive"]
    assert json.loads(answer.read_text()) == {"diagnosis": DIAGNOSIS}
    assert node.group.signals == []  # the worker raises its timeout itself
    reason, _ = node.watch.explain(WorkerExit(1, 1001, 1, 0.0, 5.0))  # type: ignore[misc]
    assert reason.startswith("exit code 1 after a collective timed out; hang diagnosis: rank 0 waits")
    assert node.watch.explain(WorkerExit(0, 1000, 1, 0.0, 5.0)) is None  # rank 0 did not ask
    later = ask(node, 0, "rank 0: ...")  # a later request in the same attempt: answered, not gathered again
    node.tick(0.1)
    assert later.exists()
    assert len(node.debug.hangs) == 1


def test_a_node_that_did_not_claim_answers_with_the_claimers_diagnosis_or_none_after_the_wait(
    tmp_path: Path,
) -> None:
    backend = MemoryBackend(tmp_path.name)
    other = Node(tmp_path, backend, "n1", timeout=0.0)
    backend.compare_and_set(debug_hang_claim_key(7), {"node": "n0", "why": "x"}, version=None)
    answer = ask(other, 0, "rank 0: CollectiveTimeout ...")
    other.tick(0.1)
    assert other.debug.hangs == []
    assert not answer.exists()  # the claimer has no diagnosis yet
    backend.set(debug_hang_claim_key(7), {"node": "n0", "why": "x", "diagnosis": "diagnosis: from n0"})
    other.tick(1)
    assert json.loads(answer.read_text()) == {"diagnosis": "diagnosis: from n0"}

    late = Node(tmp_path, backend, "n2", timeout=0.0)
    late.watch.follow(late.group, 8, late.attempt, {}, late.failure_of)  # type: ignore[arg-type]
    backend.compare_and_set(debug_hang_claim_key(8), {"node": "n0", "why": "x"}, version=None)
    answer = ask(late, 1, "rank 1: ...")
    late.tick(0.1)
    late.tick(ANSWER_WAIT)
    assert not answer.exists()
    late.tick(1)  # the claimer never published a diagnosis: the worker is not kept waiting for ever
    assert json.loads(answer.read_text()) == {"diagnosis": ""}


def test_the_flight_mark_reads_the_header_and_the_last_end_of_the_worker_file(tmp_path: Path) -> None:
    hooks = load_hooks()
    path = tmp_path / "rank_0.flight"
    mark = FlightMark(path)
    assert mark.read() == (0, 0, 0.0)  # no file yet
    recorder = hooks.FlightRecorder(str(path))
    assert mark.read() == (0, 0, 0.0)
    done = 0
    for n in range(1, 70):  # past the ring's end
        offset = recorder.begin(b"all_reduce", None, Tensor())
        assert mark.read() == (n, done, 0.0)  # started, not completed
        if n % 3 == 0:  # asynchronous, its work waited for at once
            work = Work()
            recorder.end_with(work, n - 1)
            assert mark.read() == (n, done, 0.0)
            work.wait()
            done += 1
        else:
            recorder.end(offset, n % 3 == 1)
        count, completed, end = mark.read()
        assert (count, completed) == (n, done)
        assert end == -1.0 if n % 3 == 1 else end > 0
    mark.close()


@pytest.mark.parametrize("value", ["off", 0, "0s"])
def test_hang_timeout_off(value: Any) -> None:
    from rallypoint.agent.debug_config import DebugSection

    assert DebugSection.model_validate({"hang_timeout": value}).hang_timeout == 0.0
    assert DebugSection().model_dump(mode="json") == {"hang_timeout": "off"}
    assert DebugSection.model_validate({"hang_timeout": "2m"}).model_dump(mode="json") == {"hang_timeout": "2m"}
