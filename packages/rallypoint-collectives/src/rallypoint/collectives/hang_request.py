"""A call that times out asks the agent for the hang report before it raises (issue #40).

Under ``rallypoint run`` a worker has ``RALLYPOINT_WORKER_DEBUG_DIR``, the directory its
debugging hooks write into. When a facade call gives up (its
:class:`~rallypoint.collectives.CollectiveTimeout` is about to be raised), :func:`ask_agent`
writes ``rank_<RANK>.hang`` there (JSON: ``why``, ``time``); the agent sees it at its next
monitor check (:mod:`rallypoint.agent.hang_watch`), gathers the stacks and flight records of
every worker on every node *while the hang is still there*, writes the hang report next to
``failure.json`` and answers with ``rank_<RANK>.hang.done`` (JSON: ``diagnosis``). The call
waits for that answer (at most :data:`ANSWER_WAIT` seconds), prints the diagnosis on stderr, and
raises; the failure the agent reports carries the diagnosis.

Outside ``rallypoint run`` (no directory) nothing happens. Importing this module imports no torch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING

from rallypoint.collectives.errors import format_ranks

if TYPE_CHECKING:
    from rallypoint.collectives.errors import CollectiveTimeout

__all__ = ["ANSWER_WAIT", "DEBUG_DIR_ENV", "ask_agent"]

#: The workers' debug directory (set by the agent; the names are shared with ``rallypoint.agent.hang_watch``).
DEBUG_DIR_ENV = "RALLYPOINT_WORKER_DEBUG_DIR"
#: The longest a call waits for the agent's answer, in seconds (the agent answers within a few).
ANSWER_WAIT = 20.0


def _why(err: CollectiveTimeout) -> str:
    missing = f": rank(s) {format_ranks(err.missing)} did not arrive" if err.missing else ""
    return f"rank {err.rank}: CollectiveTimeout in {err.op} on {err.group} after {err.timeout:g}s{missing}"


def ask_agent(err: CollectiveTimeout, *, wait: float = ANSWER_WAIT) -> str | None:
    """Ask the agent for the hang report and wait for it; the diagnosis line (``None``: no answer, no agent).

    Never raises: the timeout is raised by the caller either way. A worker asks once: a later
    timeout finds the answer already there.
    """
    directory = os.environ.get(DEBUG_DIR_ENV)
    rank = os.environ.get("RANK")
    if not directory or rank is None:
        return None
    request = os.path.join(directory, f"rank_{rank}.hang")
    answer = request + ".done"
    try:
        if not os.path.exists(request):
            tmp = request + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"why": _why(err), "time": time.time()}, f)
            os.replace(tmp, request)
        deadline = time.monotonic() + wait
        while not os.path.exists(answer):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        with open(answer) as f:
            diagnosis = str(json.load(f).get("diagnosis") or "")
    except (OSError, ValueError, AttributeError):
        return None
    if diagnosis:
        print(f"rallypoint: hang report of every worker (agent log dir, hang_report.txt): {diagnosis}", file=sys.stderr)
    return diagnosis
