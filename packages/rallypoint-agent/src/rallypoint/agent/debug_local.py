"""``rallypoint debug stacks`` for a job whose rendezvous lives inside its agent (the ``memory`` backend).

Such a job has no shared key space in which to ask its agent, but everything the agent would
answer with is on this machine: each worker's stacks file (``<log dir>/attempt_N/debug/
rank_R.stacks``, which names the worker's pid on its first line and which the worker keeps open),
its flight record next to it, and ``/proc``. The command, run as the same user on the same
machine, signals the workers and reads them itself, as the agent does
(:func:`~rallypoint.agent.debug_collect.collect_workers`).

A pid is signalled only when it still holds its stacks file open: the real-time signal would
kill a process that did not install the hooks, such as one that got a finished worker's pid.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from pathlib import Path
from typing import Any

from rallypoint.agent.debug_collect import collect_workers

__all__ = ["latest_debug_dir", "local_answer", "running_workers"]

_ATTEMPT = re.compile(r"^attempt_(\d+)$")
_STACKS = re.compile(r"^rank_(\d+)\.stacks$")
_HEADER = re.compile(rb"^# rallypoint stacks pid=(\d+)\s*$")


def latest_debug_dir(log_dir: Path) -> Path | None:
    """``<log_dir>/attempt_N/debug`` of the highest ``N`` that has one (``None``: no attempt started)."""
    attempts = []
    with contextlib.suppress(OSError):
        for entry in log_dir.iterdir():
            m = _ATTEMPT.match(entry.name)
            if m and (entry / "debug").is_dir():
                attempts.append((int(m.group(1)), entry / "debug"))
    return max(attempts)[1] if attempts else None


def _holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (same user: ``/proc/PID/fd`` is readable)."""
    target = os.path.realpath(path)
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
    return False


def running_workers(debug_dir: Path) -> dict[int, tuple[int, int]]:
    """``rank -> (pid, local rank)`` of the workers of ``debug_dir`` that still run.

    One node holds every rank of such a job, so a worker's local rank is its rank.
    """
    found: dict[int, tuple[int, int]] = {}
    with contextlib.suppress(OSError):
        for entry in debug_dir.iterdir():
            m = _STACKS.match(entry.name)
            if not m:
                continue
            header = None
            with contextlib.suppress(OSError), entry.open("rb") as f:
                header = _HEADER.match(f.readline())
            if header and _holds_open(int(header.group(1)), entry):
                rank = int(m.group(1))
                found[rank] = (int(header.group(1)), rank)
    return found


def local_answer(debug_dir: Path, node: str, *, timeout: float = 1.5) -> dict[str, Any]:
    """What this machine's workers are doing, in the shape of an agent's answer to a debug request."""
    workers = collect_workers(running_workers(debug_dir), debug_dir, timeout=timeout)
    return {"node": node, "host": socket.gethostname(), "agent_pid": None, "workers": workers}
