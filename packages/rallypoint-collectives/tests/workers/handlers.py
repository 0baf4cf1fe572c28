"""Worker: timeout handlers and shared deadlines, as a training script uses them.

``handlers.py scenarios`` (3 ranks; rank 0 checks, ranks 1 and 2 play along), in order:

* ``wait``: a process-wide handler answers ``WaitMore(30)`` to rank 0's ``barrier(timeout=1)``;
  rank 1 joins the barrier only once the handler has been called (a store key), rank 2 at once.
  The barrier then completes, the group is not broken, and an ``all_reduce`` still works.
* ``budget``: rank 0 receives from ranks 1 and 2 under one ``Deadline(30)``.
* ``twice``: ``on_timeout=`` answers ``WaitMore(0.5)`` every time; rank 1 never joins the barrier:
  the handler is called twice (the second time it may not wait more) and the error is raised.
* ``spent``: under ``Deadline(1.5)`` rank 0 receives from rank 1 (sent), then from rank 2 (never
  sent): the error lists how much of the budget each receive used.

``handlers.py exit``: 2 ranks; ``on_timeout`` answers ``ExitProcess(7)`` to a barrier rank 1
never joins: rank 0 exits with status 7.

Rank 0 prints ``RESULT <scenario> <json>`` lines; ranks synchronise through the job's store.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import rallypoint.collectives as rc
from rallypoint.collectives.broken import is_broken


def result(name: str, data: dict[str, Any]) -> None:
    print(f"RESULT {name} " + json.dumps(data), flush=True)


def wait_for(condition: Callable[[], bool], what: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() >= end:
            raise AssertionError(f"gave up after {deadline:g}s waiting for {what}")
        time.sleep(0.01)


def arrival_key(call: int, rank: int) -> str:
    """Where ``rank`` announces that it waits in call ``call`` on WORLD (docs/collectives.md)."""
    name = dist.distributed_c10d._get_process_group_name(dist.distributed_c10d._get_default_group())
    return f"rallypoint/collectives/{name}/{call}/{rank}"


def event_dict(ev: rc.TimeoutEvent) -> dict[str, Any]:
    return {
        "op": ev.op,
        "group": ev.group,
        "missing": list(ev.missing),
        "arrived": list(ev.arrived),
        "rank": ev.rank,
        "elapsed": ev.elapsed,
        "timeout": ev.timeout,
        "attempt": ev.attempt,
        "can_wait_more": ev.can_wait_more,
        "deadline": None if ev.deadline is None else ev.deadline.timeout,
        "error_is_timeout": isinstance(ev.error, rc.CollectiveTimeout),
    }


def scenario_wait(rank: int, store: Any, pg: Any) -> None:
    events: list[dict[str, Any]] = []

    def handler(ev: rc.TimeoutEvent) -> rc.WaitMore:
        events.append({**event_dict(ev), "broken_in_handler": is_broken(pg)})
        store.set("wait/handler", "1")
        return rc.WaitMore(30)

    if rank == 0:
        # rank 2 waits in the barrier (call 1 on WORLD) before rank 0 starts its timeout
        wait_for(lambda: store.check([arrival_key(1, 2)]), "rank 2 to announce the barrier")
        previous = rc.set_timeout_handler(handler)
        start = time.monotonic()
        rc.barrier(timeout=1)
        elapsed = time.monotonic() - start
        rc.set_timeout_handler(previous)
        total = rc.all_reduce(torch.ones(2)).tolist()
        result("wait", {"events": events, "elapsed": elapsed, "broken": is_broken(pg), "sum": total})
    else:
        if rank == 1:
            wait_for(lambda: store.check(["wait/handler"]), "rank 0's timeout handler")
        rc.barrier()
        rc.all_reduce(torch.ones(2))


def scenario_budget(rank: int) -> None:
    if rank == 0:
        deadline = rc.Deadline(30)
        before = deadline.closed
        deadline.close()
        got = []
        for src in (1, 2):
            buf = torch.zeros(1)
            rc.recv(buf, src, timeout=deadline)
            got.append(buf.item())
        waits = [[w.what, w.seconds, w.timed_out] for w in deadline.waits]
        result(
            "budget",
            {
                "closed_before": before,
                "closed": deadline.closed,
                "got": got,
                "waits": waits,
                "timed_out": deadline.is_timed_out(),
                "remaining": deadline.remaining(),
            },
        )
    else:
        rc.send(torch.full((1,), float(rank)), 0)


def scenario_twice(rank: int, store: Any) -> None:
    if rank == 0:
        events: list[dict[str, Any]] = []

        def again(ev: rc.TimeoutEvent) -> rc.WaitMore:
            events.append(event_dict(ev))
            return rc.WaitMore(0.5)

        # rank 2 waits in the barrier (call 3 on WORLD) before rank 0 starts its timeout
        wait_for(lambda: store.check([arrival_key(3, 2)]), "rank 2 to announce the barrier")
        start = time.monotonic()
        try:
            rc.barrier(timeout=1, on_timeout=again)
        except rc.CollectiveTimeout as exc:
            result("twice", {"events": events, "elapsed": time.monotonic() - start, "message": str(exc)})
        else:
            raise AssertionError("the barrier did not time out")
        wait_for(lambda: store.check(["twice/rank2"]), "rank 2 to give up the barrier")
        store.set("twice/done", "1")
    elif rank == 2:  # rank 1 never joins: rank 2 waits (its announcement stays), then gives up
        with contextlib.suppress(rc.CollectiveTimeout):
            rc.barrier(timeout=1)
        store.set("twice/rank2", "1")  # rank 0's 'spent' closes the 0-2 pair: not while this waits
        wait_for(lambda: store.check(["twice/done"]), "rank 0 to finish 'twice'")
    else:
        wait_for(lambda: store.check(["twice/done"]), "rank 0 to finish 'twice'")


def scenario_spent(rank: int, store: Any) -> None:
    if rank == 0:
        deadline = rc.Deadline(1.5)
        seen: list[dict[str, Any]] = []

        def more(ev: rc.TimeoutEvent) -> rc.WaitMore:
            seen.append(event_dict(ev))
            return rc.WaitMore(5)

        wait_for(lambda: store.check(["spent/sent"]), "rank 1 to post its send")  # before the budget starts
        start = time.monotonic()
        buf = torch.zeros(1)
        rc.recv(buf, 1, timeout=deadline)
        try:
            rc.recv(buf, 2, timeout=deadline, on_timeout=more)
        except rc.CollectiveTimeout as exc:
            elapsed = time.monotonic() - start
            data = {"message": str(exc), "elapsed": elapsed, "timed_out": deadline.is_timed_out(), "events": seen}
            data["waits"] = [[w.what, w.seconds, w.timed_out] for w in deadline.waits]
            result("spent", data)
        else:
            raise AssertionError("the second recv did not time out")
        store.set("spent/done", "1")
    else:
        if rank == 1:
            work = rc.isend(torch.ones(1), 0)
            store.set("spent/sent", "1")
            assert work is not None
            work.wait()
        wait_for(lambda: store.check(["spent/done"]), "rank 0 to finish 'spent'")


def scenarios(rank: int, store: Any) -> None:
    pg = dist.distributed_c10d._get_default_group()
    scenario_wait(rank, store, pg)
    scenario_budget(rank)
    scenario_twice(rank, store)
    scenario_spent(rank, store)


def exit_scenario(rank: int, store: Any) -> None:
    if rank == 0:
        print(f"TIMING_OUT {time.time():.3f}", flush=True)
        rc.barrier(timeout=1, on_timeout=lambda ev: rc.ExitProcess(7))
        raise AssertionError("the barrier returned")
    with contextlib.suppress(Exception):  # rank 0's store goes away when it exits
        store.wait(["never"], timedelta(seconds=120))


def main() -> None:
    rc.init()
    rank = rc.get_rank()
    store = dist.distributed_c10d._get_default_store()
    if sys.argv[1] == "exit":
        exit_scenario(rank, store)
        return
    scenarios(rank, store)
    store.add("finished", 1)
    if rank == 0:  # keep the store up until everyone is done
        wait_for(lambda: store.add("finished", 0) >= rc.get_world_size(), "every rank to finish")


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # report any failure, then exit with its status
        if not isinstance(exc, SystemExit):
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
