"""The collective flight record (#40): what debug_hooks writes, debug_flight reads back."""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import time
import types
from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent import worker_main
from rallypoint.agent.debug_collect import DUMP_SIGNAL, collect_workers, parse_faulthandler
from rallypoint.agent.debug_flight import read_flight

HOOKS = Path(worker_main.PATH).with_name("debug_hooks.py")


def load_hooks() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("_test_debug_hooks", HOOKS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Tensor:
    def __init__(self, *shape: int) -> None:
        self.shape = shape
        self.dtype = "torch.float32"


def fake_distributed(calls: list[Any]) -> types.ModuleType:
    dist = types.ModuleType("fake_distributed")

    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> str:
        calls.append(("all_reduce", tensor.shape, group, async_op))
        return "work"

    def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None) -> None:
        calls.append(("barrier", group))

    dist.all_reduce = all_reduce  # type: ignore[attr-defined]
    dist.barrier = barrier  # type: ignore[attr-defined]
    return dist


def test_recorded_calls_are_read_back_with_seq_per_group_and_state(tmp_path: Path) -> None:
    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "rank_0.flight"))
    calls: list[Any] = []
    dist = fake_distributed(calls)
    hooks.patch_distributed(dist, recorder)
    hooks.patch_distributed(dist, recorder)  # twice: wrapped once
    group = types.SimpleNamespace(group_name="tp")
    assert dist.all_reduce(Tensor(2, 3)) == "work"
    dist.all_reduce(Tensor(5), None, group)  # group passed by position
    dist.all_reduce(Tensor(5), group=group, async_op=True)
    dist.barrier()
    assert calls[0] == ("all_reduce", (2, 3), None, False)
    assert len(calls) == 4
    records = read_flight(tmp_path / "rank_0.flight")
    assert [(r["op"], r["group"], r["seq"]) for r in records] == [
        ("all_reduce", "default", 0),
        ("all_reduce", "tp", 0),
        ("all_reduce", "tp", 1),
        ("barrier", "default", 1),
    ]
    assert records[0]["shape"] == [2, 3]
    assert records[0]["dtype"] == "float32"
    assert isinstance(records[0]["end"], float)
    assert records[0]["duration"] >= 0
    assert records[2]["end"] == "async"
    assert records[2]["duration"] is None
    assert records[3]["shape"] == []


def test_the_default_group_passed_as_itself_is_the_default_group_with_one_sequence(tmp_path: Path) -> None:
    """DDP passes the default group itself, user code passes None: one collective sequence, named "default"."""
    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "rank_0.flight"))
    calls: list[Any] = []
    dist = fake_distributed(calls)
    world = types.SimpleNamespace(group_name="0")  # torch names the default group "0"
    dist.GroupMember = types.SimpleNamespace(WORLD=world)  # type: ignore[attr-defined]
    hooks.patch_distributed(dist, recorder)
    dist.all_reduce(Tensor(4), group=world)  # the group itself first (DDP's first bucket)
    dist.all_reduce(Tensor(1))  # then None (the user's loss)
    dist.barrier(world)
    records = read_flight(tmp_path / "rank_0.flight")
    assert [(r["op"], r["group"], r["seq"]) for r in records] == [
        ("all_reduce", "default", 0),
        ("all_reduce", "default", 1),
        ("barrier", "default", 2),
    ]


class Work:
    """torch's work handle as the hooks see it: ``wait`` and ``is_completed`` (its class gets them wrapped)."""

    def __init__(self) -> None:
        self.done = False

    def wait(self, timeout: Any = None) -> bool:
        if not self.done:
            raise RuntimeError("timed out")  # as Gloo's wait(timeout) does
        return True

    def is_completed(self) -> bool:
        return self.done


def test_an_asynchronous_call_is_in_flight_until_its_work_is_seen_complete(tmp_path: Path) -> None:
    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "rank_0.flight"))
    works = [Work(), Work(), Work()]
    dist = types.ModuleType("fake_distributed")
    dist.all_reduce = lambda tensor, op=None, group=None, async_op=False: works.pop(0) if async_op else None  # type: ignore[attr-defined]
    hooks.patch_distributed(dist, recorder)
    first, second, third = works
    assert dist.all_reduce(Tensor(4), async_op=True) is first
    assert dist.all_reduce(Tensor(8), None, None, True) is second  # async_op by position
    assert dist.all_reduce(Tensor(2), async_op=True) is third
    assert [r["end"] for r in read_flight(tmp_path / "rank_0.flight")] == [None, None, None]  # in flight
    with pytest.raises(RuntimeError, match="timed out"):
        second.wait(0.1)  # a wait that times out: still in flight
    assert not first.is_completed()
    second.done = first.done = True
    assert second.wait()  # waited for
    records = read_flight(tmp_path / "rank_0.flight")
    assert [r["end"] is None for r in records] == [True, False, True]
    assert records[1]["duration"] >= 0
    assert first.is_completed()  # polled, never waited for
    assert [r["end"] is None for r in read_flight(tmp_path / "rank_0.flight")] == [False, False, True]
    assert recorder.completed == [2]
    assert first.wait()  # seen again: counted once
    assert recorder.completed == [2]


def test_an_asynchronous_call_whose_end_cannot_be_seen_or_without_work(tmp_path: Path) -> None:
    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "f"))
    recorder.begin(b"all_reduce", None, Tensor(1))
    recorder.end_with(object(), 0)  # a class that cannot be wrapped: issued, its end not seen
    recorder.begin(b"all_reduce", None, Tensor(1))
    recorder.end_with(None, 1)  # a rank outside the group: nothing was issued
    unseen, outside = read_flight(tmp_path / "f")
    assert unseen["end"] == "async"
    assert isinstance(outside["end"], float)


def test_a_work_freed_unwaited_leaves_its_record_unseen_when_its_id_comes_again(tmp_path: Path) -> None:
    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "f"))
    work = Work()
    for n in range(2):  # the same id twice: the first work is gone
        recorder.begin(b"all_reduce", None, Tensor(1))
        recorder.end_with(work, n)
    work.done = True
    work.wait()
    freed, waited = read_flight(tmp_path / "f")
    assert freed["end"] == "async"
    assert isinstance(waited["end"], float)


def test_works_kept_and_never_waited_for_are_followed_up_to_a_bound(tmp_path: Path) -> None:
    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "f"))
    works = [Work() for _ in range(hooks._MAX_PENDING + 1)]
    for n, work in enumerate(works):
        recorder.begin(b"all_reduce", None, Tensor(1))
        recorder.end_with(work, n)
    assert len(recorder.pending) == hooks._MAX_PENDING
    assert id(works[0]) not in recorder.pending  # the oldest is forgotten (its slot long reused here)
    works[-1].done = True
    assert works[-1].is_completed()
    assert isinstance(read_flight(tmp_path / "f")[-1]["end"], float)


def test_a_late_completion_does_not_stamp_a_slot_the_ring_gave_to_a_newer_call(tmp_path: Path) -> None:
    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "f"))
    late = Work()
    recorder.begin(b"all_reduce", None, Tensor(1))
    recorder.end_with(late, 0)
    for _ in range(hooks.SLOTS - 1):
        recorder.end(recorder.begin(b"broadcast", None, Tensor(1)), False)
    recorder.begin(b"barrier", None, None)  # takes the all_reduce's slot, and waits
    late.done = True
    late.wait()
    records = read_flight(tmp_path / "f")
    assert records[-1]["op"] == "barrier"
    assert records[-1]["end"] is None
    assert recorder.completed == [1]  # the completion still counts as progress


def test_a_call_that_never_returns_stays_in_flight_and_the_ring_keeps_the_last(tmp_path: Path) -> None:
    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "f"))
    for _ in range(hooks.SLOTS + 5):
        recorder.end(recorder.begin(b"broadcast", None, Tensor(1)), False)
    recorder.begin(b"all_reduce", None, Tensor(4))  # hangs: no end
    records = read_flight(tmp_path / "f")
    assert len(records) == hooks.SLOTS
    assert records[-1]["op"] == "all_reduce"
    assert records[-1]["seq"] == hooks.SLOTS + 5
    assert records[-1]["end"] is None
    assert records[0]["seq"] == 6


def test_no_flight_file_reads_as_no_record(tmp_path: Path) -> None:
    assert read_flight(tmp_path / "absent") == []
    (tmp_path / "short").write_bytes(b"\0" * 10)
    assert read_flight(tmp_path / "short") == []


def test_parse_faulthandler_reads_every_thread_innermost_first() -> None:
    text = (
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        '  File "/job/train.py", line 12 in prefetch\n'
        "\n"
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/job/train.py", line 88 in main\n'
        '  File "/job/train.py", line 90 in <module>\n'
    )
    threads = parse_faulthandler(text)
    assert [t["id"] for t in threads] == ["0x00007f0000000001", "0x00007f0000000002"]
    assert [t["current"] for t in threads] == [False, True]
    assert threads[0]["frames"][0] == {"file": "/usr/lib/python3.11/threading.py", "line": 320, "func": "wait"}
    assert [f["line"] for f in threads[1]["frames"]] == [88, 90]


def test_collect_signals_only_hooked_workers_and_reads_their_dump(tmp_path: Path) -> None:
    # this process plays a hooked worker: it registers the dump like debug_hooks does
    with (tmp_path / "rank_0.stacks").open("a", buffering=1) as f:
        faulthandler.register(DUMP_SIGNAL, file=f, all_threads=True, chain=False)
        try:
            f.write(f"# rallypoint stacks pid={os.getpid()}\n")
            started = time.monotonic()
            # rank 1 names a pid that has no hooks (no stacks file): it must not be signalled
            out = collect_workers({0: (os.getpid(), 0), 1: (os.getpid(), 1)}, tmp_path, timeout=2.0)
            took = time.monotonic() - started
        finally:
            faulthandler.unregister(DUMP_SIGNAL)
    assert out[0]["dumped"]
    assert any(
        fr["func"] == "test_collect_signals_only_hooked_workers_and_reads_their_dump"
        for t in out[0]["threads"]
        for fr in t["frames"]
    )
    assert not out[1]["dumped"]
    assert out[1]["threads"] == []
    assert out[1]["state"] in "RS"
    assert out[0]["tasks"]
    assert all("wchan" in t for t in out[0]["tasks"])
    assert took < 1.0


C10D = """
class GroupMember:
    WORLD = None

class Group:
    def __init__(self, name, ranks):
        self.group_name, self.ranks = name, ranks

def get_global_rank(group, group_rank):
    return group.ranks[group_rank]

def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    return Work(done=True)

def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    return Work(done=False)

def _logged(fn):  # torch wraps its send and recv in a logger
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    wrapper.__wrapped__ = fn
    return wrapper

@_logged
def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    group = group or GroupMember.WORLD
    isend(tensor, group=group, tag=tag, group_dst=dst).wait()

@_logged
def recv(tensor, src=None, group=None, tag=0, group_src=None):
    irecv(tensor, src=src, group=group, tag=tag, group_src=group_src).wait()

class P2POp:
    def __init__(self, op, tensor, peer, group=None, tag=0):
        if op not in [isend, irecv]:
            raise ValueError("Invalid op")
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag

def batch_isend_irecv(ops):
    works = [
        op.op(op.tensor, group=op.group, tag=op.tag, **{"group_dst" if op.op is isend else "group_src": op.peer})
        for op in ops
    ]
    return [BATCH] if COALESCING else works
"""


def fake_c10d() -> tuple[types.ModuleType, types.ModuleType]:
    """A stand-in for ``torch.distributed`` and its ``distributed_c10d``, whose send/recv/batch call its globals."""
    c10d = types.ModuleType("fake_c10d")
    c10d.Work = Work  # type: ignore[attr-defined]
    exec(C10D, c10d.__dict__)
    c10d.GroupMember.WORLD = c10d.Group("0", [0, 1, 2, 3])  # type: ignore[attr-defined]
    c10d.COALESCING = False  # type: ignore[attr-defined]
    dist = types.ModuleType("fake_distributed")
    for name in ("isend", "irecv", "send", "recv", "batch_isend_irecv", "P2POp", "GroupMember", "get_global_rank"):
        setattr(dist, name, getattr(c10d, name))
    dist.distributed_c10d = c10d  # type: ignore[attr-defined]
    return dist, c10d


class ReadyWork(Work):
    def __init__(self, done: bool = False) -> None:
        self.done = done


def test_point_to_point_calls_are_recorded_with_peer_tag_bytes_and_their_own_seq(tmp_path: Path) -> None:
    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "rank_1.flight"))
    dist, c10d = fake_c10d()
    c10d.Work = ReadyWork  # type: ignore[attr-defined]
    hooks.patch_distributed(dist, recorder)
    assert c10d.isend is dist.isend  # torch's send finds the wrapper among its globals
    tp = c10d.Group("tp", [2, 3])
    dist.send(Tensor(4), 0)  # torch's blocking send: recorded once, as "send", complete
    dist.isend(Tensor(2, 2), 3, tag=5)
    dist.isend(Tensor(4), group=tp, group_dst=1)  # global rank 3 in its group
    dist.send(Tensor(4), 0)
    late = dist.irecv(Tensor(4))  # from any rank
    recvd = dist.irecv(Tensor(1), 0, None, 9)
    records = read_flight(tmp_path / "rank_1.flight")
    got = [(r["op"], r["seq"], r["peer"], r["tag"], r["group"], r["bytes"]) for r in records]
    assert got == [
        ("send", 0, 0, 0, "default", 16),  # the default group passed by torch's send is "default"
        ("isend", 0, 3, 5, "default", 16),
        ("isend", 0, 3, 0, "tp", 16),
        ("send", 1, 0, 0, "default", 16),
        ("irecv", 0, -1, 0, "default", 16),
        ("irecv", 0, 0, 9, "default", 4),
    ]
    assert [isinstance(r["end"], float) for r in records] == [True, False, False, True, False, False]
    assert records[1]["shape"] == [2, 2]
    late.done = recvd.done = True
    assert late.is_completed()
    recvd.wait()
    assert all(isinstance(r["end"], float) for r in read_flight(tmp_path / "rank_1.flight")[4:])
    assert [r["op"] for r in records if r["peer"] is None] == []  # every point-to-point record has its peer
    dist.P2POp(dist.isend, Tensor(1), 0)  # torch's check of the op still knows the wrapped function


def test_a_coalesced_batch_is_followed_through_the_one_work_it_returns(tmp_path: Path) -> None:
    """As NCCL's ``batch_isend_irecv`` does it: the operations' own works are not the ones returned."""
    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "rank_0.flight"))
    dist, c10d = fake_c10d()
    c10d.Work = ReadyWork  # type: ignore[attr-defined]
    batch = c10d.BATCH = ReadyWork()  # type: ignore[attr-defined]
    hooks.patch_distributed(dist, recorder)
    ops = [dist.P2POp(dist.isend, Tensor(4), 1), dist.P2POp(dist.irecv, Tensor(4), 1)]
    c10d.COALESCING = True  # type: ignore[attr-defined]
    assert dist.batch_isend_irecv(ops) == [batch]
    records = read_flight(tmp_path / "rank_0.flight")
    assert [(r["op"], r["peer"], r["end"]) for r in records] == [("isend", 1, None), ("irecv", 1, None)]
    assert not recorder.pending.keys() - {id(batch)}  # the operations' own works are forgotten
    batch.done = True
    batch.wait()
    assert all(isinstance(r["end"], float) for r in read_flight(tmp_path / "rank_0.flight"))
    c10d.COALESCING = False  # type: ignore[attr-defined]
    works = dist.batch_isend_irecv(ops)  # one work per operation (Gloo): each ends its own record
    assert len(works) == 2
    works[0].wait()
    assert [r["end"] is None for r in read_flight(tmp_path / "rank_0.flight")[2:]] == [False, True]
    works[1].done = True
    works[1].wait()
    assert all(isinstance(r["end"], float) for r in read_flight(tmp_path / "rank_0.flight"))


def test_the_wrapped_wait_passes_every_form_of_its_arguments_on(tmp_path: Path) -> None:
    calls: list[Any] = []

    class Waited:
        def wait(self, timeout: Any = "default", *more: Any, **options: Any) -> Any:
            calls.append((timeout, more, options))
            return len(calls)

        def is_completed(self) -> bool:
            return True

    hooks = load_hooks()
    recorder = hooks.FlightRecorder(str(tmp_path / "f"))
    work = Waited()
    recorder.begin(b"all_reduce", None, Tensor(1))
    recorder.end_with(work, 0)
    assert [work.wait(), work.wait(3), work.wait(timeout=4), work.wait(5, 6, x=7), work.wait(x=8)] == [1, 2, 3, 4, 5]
    assert calls == [("default", (), {}), (3, (), {}), (4, (), {}), (5, (6,), {"x": 7}), ("default", (), {"x": 8})]
    assert isinstance(read_flight(tmp_path / "f")[0]["end"], float)
