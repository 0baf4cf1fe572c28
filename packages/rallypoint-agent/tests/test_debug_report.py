"""The debug report (#40): folding identical stacks, odd ones first, and the diagnosis line."""

from __future__ import annotations

from typing import Any

from rallypoint.agent.debug_report import diagnose, rank_list, render

TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def frames(*spec: tuple[str, int, str]) -> list[dict[str, Any]]:
    return [{"file": f, "line": n, "func": fn} for f, n, fn in spec]


def record(seq: int, op: str = "all_reduce", shape: tuple[int, ...] = (4,), end: Any = None) -> dict[str, Any]:
    return {
        "seq": seq,
        "op": op,
        "dtype": "float32",
        "shape": list(shape),
        "group": "default",
        "start": seq,
        "end": end,
    }


def worker(rank: int, stack: list[dict[str, Any]], flight: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    threads = [{"id": "0x1", "current": True, "frames": stack}] if stack else []
    return {"rank": rank, "pid": 100 + rank, "state": "S", "tasks": [], "threads": threads, "flight": flight, **kw}


IN_ALL_REDUCE = frames((TORCH, 3252, "all_reduce"), ("/job/train.py", 88, "step"), ("/job/train.py", 99, "<module>"))
DONE = [record(0, end=1.0), record(1, end=2.0)]


def answer(host: str, workers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"node": host, "host": host, "workers": workers}


def test_rank_list_folds_runs() -> None:
    assert rank_list([0, 1, 2, 3, 4, 5, 6, 12, 13, 14, 15, 9]) == "0-6, 9, 12-15"
    assert rank_list([3]) == "3"
    assert rank_list([]) == ""


def test_identical_stacks_fold_and_the_odd_one_comes_first_with_host_and_pid() -> None:
    waiting = [worker(r, IN_ALL_REDUCE, [*DONE, record(2)]) for r in (0, 2, 3)]
    sleeper = worker(1, frames(("/job/train.py", 70, "load")), DONE)
    text = render([answer("h1", [*waiting[:1], sleeper]), answer("h2", waiting[1:])], missing=["h3-node"])
    lines = text.splitlines()
    assert lines[0] == "rank 1: load at train.py:70 (h1 pid 101)"
    assert "ranks 0, 2-3: all_reduce <- train.py:88" in lines
    assert "no answer from node(s): h3-node (agent gone or busy; retry)" in lines
    assert lines[-1] == (
        "diagnosis: ranks 0, 2-3 wait in all_reduce #2 (group default, float32[4]); "
        "rank 1 (host h1, pid 101) never entered it: load at train.py:70"
    )


def test_one_rank_waiting_is_said_in_the_singular() -> None:
    ws = [worker(0, IN_ALL_REDUCE, [*DONE, record(2)]), worker(1, frames(("/job/train.py", 70, "load")), DONE)]
    for w in ws:
        w["host"] = "h"
    assert diagnose(ws).startswith("diagnosis: rank 0 waits in all_reduce #2 (group default, float32[4]); rank 1 ")


def test_a_different_op_or_shape_at_the_same_sequence_number_is_a_mismatch() -> None:
    ws = [
        worker(0, IN_ALL_REDUCE, [*DONE, record(2)]),
        worker(1, IN_ALL_REDUCE, [*DONE, record(2)]),
        worker(2, IN_ALL_REDUCE, [*DONE, record(2, op="all_gather")]),
        worker(3, IN_ALL_REDUCE, [*DONE, record(2, shape=(8,), end=3.0), record(3)]),
    ]
    for w in ws:
        w["host"] = "h"
    line = diagnose(ws)
    assert line.startswith("diagnosis: ranks 0-1 wait in all_reduce #2")
    assert "rank 2 (host h, pid 102) called all_gather #2 (group default, float32[4]) instead (mismatched op)" in line
    assert "rank 3 (host h, pid 103) entered it with all_reduce #2 (group default, float32[8])" in line


def test_without_collectives_the_diagnosis_names_the_ranks_apart_and_a_stuck_process() -> None:
    ws = [worker(r, IN_ALL_REDUCE, []) for r in range(3)]
    stuck = worker(3, [], [], state="D", tasks=[{"tid": 103, "state": "D", "wchan": "fuse_wait"}])
    for w in [*ws, stuck]:
        w["host"] = "h"
    line = diagnose([*ws, stuck])
    assert line == (
        "diagnosis: no collective in flight; ranks apart from the others: "
        "rank 3 (host h, pid 103): stuck in the kernel (state D, fuse_wait): no Python stack"
    )
    assert "state D (uninterruptible): pids 103" in render([answer("h", [*ws, stuck])], [])
    assert diagnose([]) == "diagnosis: no worker answered"


def p2p(seq: int, op: str, peer: int, end: Any = None, tag: int = 0, shape: tuple[int, ...] = (16,)) -> dict[str, Any]:
    n = 1
    for d in shape:
        n *= d
    return {**record(seq, op=op, shape=shape, end=end), "peer": peer, "tag": tag, "bytes": 4 * n, "start": 10 + seq}


IN_RECV = frames((TORCH, 2790, "recv"), ("/job/pipe.py", 40, "stage"))
IN_LOADER = frames(("/usr/lib/python3.11/queue.py", 171, "get"), ("/job/pipe.py", 30, "next_batch"))


def hosted(*ws: dict[str, Any]) -> list[dict[str, Any]]:
    for w in ws:
        w["host"] = "h"
    return list(ws)


def test_a_rank_waiting_in_recv_names_the_peer_that_never_sent_and_where_that_peer_is() -> None:
    ws = hosted(
        worker(0, IN_LOADER, [p2p(0, "send", 1, end=1.0)]),  # sent #0, stuck before #1
        worker(1, IN_RECV, [p2p(0, "recv", 0, end=1.5), p2p(1, "recv", 0)]),
    )
    assert diagnose(ws) == (
        "diagnosis: rank 1 waits in recv #1 from rank 0 (group default, tag 0, float32[16], 64 bytes): "
        "rank 0 (host h, pid 100) never sent it: get <- pipe.py:30"
    )


def test_a_chain_of_waits_puts_the_rank_that_holds_it_up_first() -> None:
    ws = hosted(
        worker(0, IN_LOADER, []),
        worker(1, IN_RECV, [p2p(0, "recv", 0)]),
        worker(2, IN_RECV, [p2p(0, "recv", 1)]),
    )
    line = diagnose(ws)
    first, second = line.removeprefix("diagnosis: ").split("; ")
    assert first.startswith("rank 1 waits in recv #0 from rank 0 ")
    assert first.endswith("rank 0 (host h, pid 100) never sent it: get <- pipe.py:30")
    assert second.startswith("rank 2 waits in recv #0 from rank 1 ")
    assert second.endswith("rank 1 (host h, pid 101) never sent it: recv <- pipe.py:40")


def test_point_to_point_mismatches_of_tag_and_size_and_a_peer_in_it_too() -> None:
    tag = hosted(worker(0, IN_RECV, [p2p(0, "isend", 1, end=1.0, tag=7)]), worker(1, IN_RECV, [p2p(0, "irecv", 0)]))
    assert diagnose(tag).endswith("rank 0 (host h, pid 100) sent it with tag 7 instead (mismatched tag)")
    size = hosted(worker(0, IN_RECV, [p2p(0, "send", 1, shape=(8,))]), worker(1, IN_RECV, [p2p(0, "recv", 0, end=2.0)]))
    assert diagnose(size) == (
        "diagnosis: rank 0 waits in send #0 to rank 1 (group default, tag 0, float32[8], 32 bytes): "
        "rank 1 (host h, pid 101) received it as recv #0 from rank 0 (group default, tag 0, float32[16], 64 bytes)"
        " (mismatched size)"
    )
    both = hosted(worker(0, IN_RECV, [p2p(0, "send", 1)]), worker(1, IN_RECV, [p2p(0, "recv", 0)]))
    assert "rank 1 (host h, pid 101) is in it too: recv <- pipe.py:40" in diagnose(both)
    anyone = hosted(worker(0, IN_LOADER, []), worker(1, IN_RECV, [p2p(0, "recv", -1)]))
    assert diagnose(anyone) == (
        "diagnosis: rank 1 waits in recv #0 from any rank (group default, tag 0, float32[16], 64 bytes): "
        "no rank sends to it"
    )


def test_point_to_point_calls_do_not_count_as_collectives_and_both_are_diagnosed() -> None:
    ws = hosted(
        worker(0, IN_ALL_REDUCE, [*DONE, p2p(0, "send", 2, end=2.5), record(2)]),
        worker(1, IN_ALL_REDUCE, [*DONE, record(2)]),
        worker(2, IN_RECV, [*DONE, p2p(0, "recv", 0, end=2.6), p2p(1, "recv", 0, end=2.7), p2p(2, "recv", 0)]),
    )
    line = diagnose(ws)  # rank 2's recv #2 is not a collective #2: no "mismatched op"
    assert line.startswith("diagnosis: ranks 0-1 wait in all_reduce #2 (group default, float32[4]); ")
    assert "rank 2 (host h, pid 102) never entered it: recv <- pipe.py:40" in line
    assert line.endswith(
        "rank 2 waits in recv #2 from rank 0 (group default, tag 0, float32[16], 64 bytes): "
        "rank 0 (host h, pid 100) never sent it: all_reduce <- train.py:88"
    )
