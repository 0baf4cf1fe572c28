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
``p2p_recv`` and ``p2p_batch``: before the fourth all_reduce, ranks 0 -> 1 -> 2 pass a tensor
on (``send``/``recv``, or ``batch_isend_irecv`` and ``wait``); rank 1 receives it, then blocks in its
data-loader queue without passing it on, so rank 2 waits in its receive from rank 1.
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


def pass_on(mode: str, peer: int, t: torch.Tensor, send: bool) -> None:
    """Send ``t`` to ``peer`` or receive it from there, blocking or through ``batch_isend_irecv``."""
    if mode == "p2p_recv":
        (dist.send if send else dist.recv)(t, peer)
    else:
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend if send else dist.irecv, t, peer)]):
            work.wait()


def token_ring(mode: str, rank: int) -> None:
    """Ranks 0 -> 1 -> 2 pass a tensor on; rank 1 blocks in its data loader instead of passing it on."""
    token = torch.zeros(4)
    if rank == 0:
        pass_on(mode, 1, token, send=True)
    elif rank == 1:
        pass_on(mode, 0, token, send=False)
        next_batch(queue.Queue())
    elif rank == 2:
        pass_on(mode, 1, token, send=False)


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
    if mode in ("p2p_recv", "p2p_batch"):
        token_ring(mode, rank)
    if mode == "facade":
        rc.all_reduce(t, timeout=3.0)  # through the facade: CollectiveTimeout after 3 s
        return
    dist.all_reduce(t)  # the fourth: where the others wait
    time.sleep(float(os.environ.get("HANG_END_SLEEP", "0")))


if __name__ == "__main__":
    main()
