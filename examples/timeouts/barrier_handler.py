"""A barrier whose timeout is handled by a process-wide handler.

Every rank installs a handler (``make_handler``) with
``rallypoint.collectives.set_timeout_handler``, then calls a plain ``barrier()``, whose timeout
is the job's (``[collectives] timeout``). When the timeout expires the handler is told which
ranks did not arrive and how long the call waited; it gives the stragglers one grace period
(``WaitMore``) and, if they are still missing after it, logs and ends the worker with
``sys.exit(1)`` so that the agent restarts or fails the job at once.

    --timeout S     the barrier's own timeout (default: the job's, [collectives] timeout)
    --grace S       how much longer the handler waits, once (default 3)
    --straggler R   make rank R late ...
    --delay S       ... by S seconds (default 0: on time)

With the job's 5 s timeout and ``--straggler 1 --delay 7``, rank 1 arrives during the grace
period and every rank passes the barrier; with ``--delay 60`` the handler gives up and the job
fails within seconds.
"""

from __future__ import annotations

import argparse
import sys
import time

import rallypoint.collectives as rc


def make_handler(grace: float) -> rc.TimeoutHandler:
    """The process-wide handler: wait once more for the stragglers, then log and end this worker."""

    def on_barrier_timeout(event: rc.TimeoutEvent) -> rc.WaitMore | None:
        missing = ", ".join(map(str, event.missing)) or "unknown"
        print(
            f"rank {event.rank}: {event.op} on {event.group}: rank(s) {missing} not there after "
            f"{event.elapsed:.1f}s (timeout {event.timeout:g}s)",
            flush=True,
        )
        if event.can_wait_more:
            print(f"rank {event.rank}: waiting {grace:g}s more for them", flush=True)
            return rc.WaitMore(grace)
        print(f"rank {event.rank}: giving up: {event.error}", flush=True)
        sys.exit(1)

    return on_barrier_timeout


def main() -> None:
    """Parse the arguments, run the example on this rank."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--grace", type=float, default=3.0)
    parser.add_argument("--straggler", type=int, default=-1)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()

    rc.init()
    rank, world = rc.get_rank(), rc.get_world_size()
    rc.set_timeout_handler(make_handler(args.grace))
    if rank == args.straggler:
        print(f"rank {rank}: busy for {args.delay:g}s before the barrier", flush=True)
        time.sleep(args.delay)  # stands in for a slow data loader or a stuck step
    start = time.monotonic()
    if args.timeout is None:
        rc.barrier()  # the job's timeout: [collectives] timeout
    else:
        rc.barrier(timeout=args.timeout)
    print(f"rank {rank}: all {world} ranks passed the barrier after {time.monotonic() - start:.1f}s", flush=True)
    rc.destroy()


if __name__ == "__main__":
    main()
