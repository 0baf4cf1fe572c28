"""Rank 0 receives one value from every other rank, the whole loop under one time budget.

``rallypoint.collectives.Deadline(budget)`` is passed as ``timeout=`` to every ``recv``: each
receive waits at most what is left of the budget, and the error of the one that runs out says
how much of the budget each receive used. Afterwards rank 0 asks ``is_timed_out()``.

    --budget S      the shared budget in seconds (default 10)
    --silent R      rank R never sends (rank 0's loop then runs out of budget)

Run with three workers: ``rallypoint run --nproc-per-node 3 examples/timeouts/recv_deadline.py``.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import rallypoint.collectives as rc


def main() -> None:
    """Parse the arguments, run the example on this rank."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=10.0)
    parser.add_argument("--silent", type=int, default=-1)
    args = parser.parse_args()

    rc.init()
    rank, world = rc.get_rank(), rc.get_world_size()
    if rank != 0:
        if rank == args.silent:
            print(f"rank {rank}: not sending", flush=True)
            time.sleep(600)  # the agent stops this worker when rank 0 fails
        rc.send(torch.tensor([float(rank * 10)]), 0)
        rc.barrier()  # stay until rank 0 has received everything
        return

    deadline = rc.Deadline(args.budget)
    deadline.close()  # start counting now
    received: dict[int, float] = {}
    buf = torch.zeros(1)
    try:
        for src in range(1, world):
            rc.recv(buf, src, timeout=deadline)
            received[src] = buf.item()
            print(
                f"rank 0: got {buf.item():g} from rank {src}; {deadline.remaining():.1f}s of the budget left",
                flush=True,
            )
    except rc.CollectiveTimeout as exc:
        print(f"rank 0: {exc}", flush=True)
    late = deadline.is_timed_out()
    print(f"rank 0: received from ranks {sorted(received)}; budget spent: {late}", flush=True)
    if late:
        sys.exit(1)  # the agent stops the other workers and reports this rank
    rc.barrier()


if __name__ == "__main__":
    main()
