"""Worker: rank 1 never joins the barrier; rank 0 times out and leaves, as a user's script would.

``abandoned.py destroy``: rank 0 catches :class:`CollectiveTimeout`, calls
``rallypoint.collectives.destroy()`` and ``sys.exit(1)``. ``abandoned.py raise``: rank 0 lets the
error propagate (no ``destroy()``; the interpreter prints it and exits 1). Either way rank 0
prints ``TIMED_OUT <time.time()>`` the moment the error reaches it, so that the test can tell how
long the process took to end after it. Rank 1 joins the process group, then waits until the agent
stops it.
"""

from __future__ import annotations

import sys
import threading
import time

import rallypoint.collectives as rc


def main() -> None:
    mode = sys.argv[1]
    rc.init()
    if rc.get_rank() != 0:
        threading.Event().wait()  # never joins the barrier; the agent stops it
    try:
        rc.barrier(timeout=1.0)
    except rc.CollectiveTimeout as exc:
        print(f"TIMED_OUT {time.time()!r} missing={list(exc.missing)}", flush=True)
        print(f"ERROR {exc}", flush=True)
        if mode == "raise":
            raise
        rc.destroy()
        sys.exit(1)
    print("UNEXPECTED the barrier completed", flush=True)


if __name__ == "__main__":
    main()
