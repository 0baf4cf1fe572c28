"""Worker: the last rank never arrives; the others must get CollectiveTimeout naming it.

``timeouts.py collective T``: N ranks; rank 1 arrives late (only once rank 0 has announced its
arrival on the store, so it must not be named), the last rank never calls
``all_reduce(timeout=T)``. ``timeouts.py default``: 2 ranks, the job default timeout comes from
``RALLYPOINT_COLLECTIVES_TIMEOUT``; rank 1 posts neither the barrier nor the ``send`` that rank 0
waits for. Every rank that waits prints ``TIMEOUT <json>`` per timeout.

First, in both modes, a barrier that outlasts the probe but completes: rank 0 joins it only once
every other rank has announced its arrival on the store, and every rank then checks that its
announcement was withdrawn (``CHECK slow barrier``). Ranks synchronise through the job's store
(keys and counters polled with a deadline), never through sleeps.
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

import torch
import torch.distributed as dist

import rallypoint.collectives as rc


def report(exc: rc.CollectiveTimeout, elapsed: float) -> None:
    data = {
        "op": exc.op,
        "group": exc.group,
        "missing": list(exc.missing),
        "arrived": list(exc.arrived),
        "rank": exc.rank,
        "timeout": exc.timeout,
        "elapsed": elapsed,
        "message": str(exc),
        "is_timeout_error": isinstance(exc, TimeoutError),
    }
    print("TIMEOUT " + json.dumps(data), flush=True)


def expect_timeout(fn: object, *args: object, **kwargs: object) -> None:
    start = time.monotonic()
    try:
        fn(*args, **kwargs)  # type: ignore[operator]
    except rc.CollectiveTimeout as exc:
        report(exc, time.monotonic() - start)
    else:
        raise AssertionError(f"{fn} did not time out")


def wait_for(condition: Callable[[], bool], what: str, deadline: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() >= end:
            raise AssertionError(f"gave up after {deadline:g}s waiting for {what}")
        time.sleep(0.01)


def arrival_key(call: int, rank: int) -> str:
    """The store key where ``rank`` announces it reached call ``call`` on WORLD (docs/collectives.md)."""
    name = dist.distributed_c10d._get_process_group_name(dist.distributed_c10d._get_default_group())
    return f"rallypoint/collectives/{name}/{call}/{rank}"


def main() -> None:
    mode = sys.argv[1]
    info = rc.init()
    device = "cuda" if info.device == "cuda" else "cpu"
    rank, world = rc.get_rank(), rc.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    absent = world - 1
    # call 1, a barrier that outlasts the probe but completes: announced, then withdrawn
    if rank == 0:
        others = [arrival_key(1, r) for r in range(1, world)]
        wait_for(lambda: store.check(others), f"ranks 1-{world - 1} to announce the barrier")
    rc.barrier(timeout=60)  # an explicit timeout: NCCL announces too (it polls)
    assert not store.check([arrival_key(1, rank)]), "the barrier's announcement was not withdrawn"
    print("CHECK slow barrier", flush=True)
    if rank == absent:
        with contextlib.suppress(Exception):  # rank 0 (the store) may be gone already
            store.wait(["test/done"], timedelta(seconds=120))
            store.add("test/acknowledged", 1)
        return
    if mode == "collective":
        timeout = float(sys.argv[2])
        if rank == 1:  # arrive late, but before the deadline: after rank 0 has announced call 2
            wait_for(lambda: store.check([arrival_key(2, 0)]), "rank 0 to announce the all_reduce")
        expect_timeout(rc.all_reduce, torch.ones(8, device=device), timeout=timeout)
    else:
        assert rc.default_timeout() == float(os.environ["RALLYPOINT_COLLECTIVES_TIMEOUT"])
        expect_timeout(rc.barrier)
        # a timed-out collective leaves the point-to-point pairs usable on Gloo
        expect_timeout(rc.recv, torch.zeros(2), src=1, timeout=1.0)
    store.add("test/finished", 1)
    if rank == 0:  # keep the store up (and the absent rank alive) until every waiting rank is done
        wait_for(lambda: store.add("test/finished", 0) >= world - 1, "every waiting rank to finish")
        store.set("test/done", "1")
        wait_for(lambda: store.add("test/acknowledged", 0) >= 1, "the absent rank to see test/done")


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # noqa: BLE001 - report any failure, then exit non-zero
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
