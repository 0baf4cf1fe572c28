"""Serves torch's ``env://`` store for one round's workers: ``_store_host.py ADDR PORT``.

The agent of the node that holds worker rank 0 has its warm process fork this program when the
warm process preloaded torch (see :mod:`rallypoint.agent.agent_store`), before any worker of the
round starts: a fork, so ``torch`` is already imported and the store listens within
milliseconds. It runs as a warm worker does (through :mod:`rallypoint.agent.worker_main`, in a
session of its own, killed with its warm process) and serves until the agent ends it with
``SIGTERM``. Its first line of output, once the store listens, tells the agent so; that line
again, and anything else it writes, goes to its log. Every worker of the round connects to it as a client
(``TORCHELASTIC_USE_AGENT_STORE=True``), as torchrun's workers connect to their agent's store.

Run by path, never imported by the agent: it imports nothing of rallypoint.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta

#: How long the store's own client waits for an answer (it asks nothing after the start).
CLIENT_TIMEOUT = timedelta(seconds=60)


def main(argv: list[str]) -> int:
    """Serve the store at ``argv[1]:argv[2]`` until ended by a signal; exit 2 on a bad command line."""
    if len(argv) != 3 or not argv[2].isdigit():
        print(f"usage: {argv[0] if argv else '_store_host.py'} ADDR PORT", file=sys.stderr)
        return 2
    addr, port = argv[1], int(argv[2])
    # torch's public name; its package re-exports it without listing it for type checkers
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    # the server listens on every interface; its own client connects through addr, as the workers will
    store = TCPStore(addr, port, None, True, CLIENT_TIMEOUT, wait_for_workers=False)
    line = f"serving torch's env:// store on {addr}:{port}"
    print(line, flush=True)  # the agent waits for this line
    os.dup2(2, 1)  # the agent read its line and closes its end: anything later goes to the log
    print(line, flush=True)  # and the log says it too
    threading.Event().wait()  # until SIGTERM (its default action: the process ends, the store with it)
    del store  # pragma: no cover - never reached
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
