"""Worker: the last rank never arrives; the others must get CollectiveTimeout naming it.

``timeouts.py collective T``: N ranks; rank 1 arrives 1 s late (it must not be named), the last
rank never calls ``all_reduce(timeout=T)``. ``timeouts.py default``: 2 ranks, the job default
timeout comes from ``RALLYPOINT_COLLECTIVES_TIMEOUT``; rank 1 posts neither the barrier nor the
``send`` that rank 0 waits for. Every rank that waits prints ``TIMEOUT <json>`` per timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
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


def main() -> None:
    mode = sys.argv[1]
    info = rc.init()
    device = "cuda" if info.device == "cuda" else "cpu"
    rank, world = rc.get_rank(), rc.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    absent = world - 1
    # a call that takes longer than the probe but completes: announced, then withdrawn
    if rank == 0:
        time.sleep(0.6)
    rc.barrier()
    print("CHECK slow barrier", flush=True)
    if rank == absent:
        with contextlib.suppress(Exception):  # rank 0 (the store) may be gone already
            store.wait(["test/done"], timedelta(seconds=60))
        return
    if mode == "collective":
        timeout = float(sys.argv[2])
        if rank == 1:
            time.sleep(1.0)
        expect_timeout(rc.all_reduce, torch.ones(8, device=device), timeout=timeout)
    else:
        assert rc.default_timeout() == float(os.environ["RALLYPOINT_COLLECTIVES_TIMEOUT"])
        expect_timeout(rc.barrier)
        # a timed-out collective leaves the point-to-point pairs usable on Gloo
        expect_timeout(rc.recv, torch.zeros(2), src=1, timeout=1.0)
    store.add("test/finished", 1)
    if rank == 0:  # keep the store up (and the absent rank alive) until every waiting rank is done
        while store.add("test/finished", 0) < world - 1:
            time.sleep(0.05)
        store.set("test/done", "1")
        time.sleep(0.2)


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
