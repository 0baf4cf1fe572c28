"""Collectives started with ``async_op=True``, through torch.distributed and the rallypoint facade (#40).

Run by ``test_flight_async.py`` as 2 workers of ``rallypoint run``. Each step uses a tensor of its
own length, so that the test finds each step's record in the flight files by its shape:

1. ``dist.all_reduce(async_op=True)``, then ``wait()``;
2. ``dist.broadcast(async_op=True)``, polled with ``is_completed()``, never waited for;
3. ``rc.all_reduce`` (the facade, synchronous: on Gloo it issues torch's call asynchronously);
4. ``rc.all_reduce(async_op=True)``, then ``wait()``;
5. the facade's ``send`` (rank 0) and ``recv`` (rank 1), and torch's ``isend`` / ``irecv`` the other
   way, waited for (#40: point-to-point calls are recorded with their peer);
6. rank 0 alone starts ``dist.all_reduce(async_op=True)``: it never completes. Rank 0 then exits
   at once (``os._exit``: nothing waits for the group); rank 1 stays until rank 0 is gone, so that
   the call is not failed by a closed connection first.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import rallypoint.collectives as rc


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, exited but not yet reaped by the agent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def main() -> None:
    rc.init()
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(1), async_op=True).wait()
    work = dist.broadcast(torch.ones(2), 0, async_op=True)
    while not work.is_completed():
        time.sleep(0.01)
    rc.all_reduce(torch.ones(3))
    rc.all_reduce(torch.ones(4), async_op=True).wait()
    if rank == 0:
        rc.send(torch.ones(5), 1)
        dist.irecv(torch.ones(6), 1, tag=3).wait()
    else:
        rc.recv(torch.ones(5), 0)
        dist.isend(torch.ones(6), 0, tag=3).wait()
    dist.barrier()
    handshake = Path(sys.argv[1])
    if rank == 0:
        dist.all_reduce(torch.ones(7), async_op=True)  # rank 1 never joins it
        time.sleep(0.5)
        part = handshake.with_suffix(".part")
        part.write_text(str(os.getpid()))
        part.rename(handshake)  # whole, or not there
        print("rank 0 leaves its all_reduce in flight", flush=True)
        os._exit(0)
    deadline = time.monotonic() + 60
    while not handshake.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(handshake.read_text())
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    print("rank 1 done", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
