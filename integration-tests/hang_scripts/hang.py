"""A plain torch.distributed script (no rallypoint import) in which one rank hangs: ``hang.py MODE``.

Rank 1 misbehaves, the others call ``all_reduce`` after three good ones. MODE:
``python_sleep`` (rank 1 waits in a Python function before the all_reduce), ``queue`` (it blocks in
a data-loader queue), ``all_gather`` (it calls all_gather instead), ``shape`` (its tensor has another
shape), ``socket`` (it blocks in a socket read: C code without the GIL), ``watchdog`` (it blocks in the
data-loader queue inside a 2 s watchdog scope). ``watchdog`` and ``facade`` are the modes that import
rallypoint: ``facade``: rank 1 waits as in ``python_sleep``, the others call the fourth all_reduce
through the rallypoint facade with a 3 s timeout (they raise CollectiveTimeout). ``slow`` hangs
nowhere: every rank calls all_reduce once a second, ``SLOW_STEPS`` times (default 6), and ends (a
job slower than nothing, but faster than its ``[debug] hang_timeout``).
"""

import os
import queue
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist


def wait_for_batch_python() -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        sum(range(1000))


def next_batch(q: queue.Queue) -> object:
    return q.get()


def read_from_socket() -> bytes:
    a, _b = socket.socketpair()
    return a.recv(1)


def prefetch(stop: threading.Event) -> None:
    stop.wait()


def main() -> None:
    mode = sys.argv[1]
    threading.Thread(target=prefetch, args=(threading.Event(),), daemon=True).start()  # a second Python thread
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if mode == "facade":
        import rallypoint.collectives as rc

        rc.init()  # adopts the process group
    print(f"rank {rank} ready", flush=True)
    if mode == "slow":
        for _ in range(int(os.environ.get("SLOW_STEPS", "6"))):
            time.sleep(1.0)
            dist.all_reduce(t)
        print(f"rank {rank} done", flush=True)
        return
    if rank == 1:
        if mode in ("python_sleep", "facade"):
            wait_for_batch_python()
        elif mode == "queue":
            next_batch(queue.Queue())
        elif mode == "watchdog":
            from rallypoint.timer import expires

            with expires(after=2.0, scope="data_load"):
                next_batch(queue.Queue())
        elif mode == "socket":
            read_from_socket()
        elif mode == "all_gather":
            out = [torch.zeros(4) for _ in range(dist.get_world_size())]
            dist.all_gather(out, t)
        elif mode == "shape":
            dist.all_reduce(torch.ones(2))
    if mode == "facade":
        rc.all_reduce(t, timeout=3.0)  # through the facade: CollectiveTimeout after 3 s
        return
    dist.all_reduce(t)  # the fourth: where the others wait
    time.sleep(float(os.environ.get("HANG_END_SLEEP", "0")))


if __name__ == "__main__":
    main()
