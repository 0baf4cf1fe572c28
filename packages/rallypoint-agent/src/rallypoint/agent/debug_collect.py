"""Collecting what this node's workers are doing: stacks, flight records, process states.

Each worker that installed :mod:`rallypoint.agent.debug_hooks` gets :data:`DUMP_SIGNAL` and
appends every thread's Python stack to its stacks file, from a C signal handler (no GIL needed);
the agent reads what was appended. What the kernel says comes with it, for every worker: the
process state (``R``, ``S``, ``D``...) and ``wchan`` of each thread from ``/proc``, which needs
no ptrace and no privilege (same user). Workers that did not install the hooks (a non-Python
``--no-python`` command) are never signalled: the real-time signal would kill them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from rallypoint.agent.debug_flight import read_flight

__all__ = ["DUMP_SIGNAL", "collect_workers", "parse_faulthandler", "proc_state"]

#: Must match :data:`rallypoint.agent.debug_hooks.DUMP_SIGNAL`.
DUMP_SIGNAL = signal.SIGRTMIN + 5

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)(?: \[[^\]]*\])? \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')


def parse_faulthandler(text: str) -> list[dict[str, Any]]:
    """Threads (``id``, ``current``, ``frames`` innermost first: ``file``, ``line``, ``func``) of a dump."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            threads.append({"id": m.group(2), "current": m.group(1) == "Current thread", "frames": []})
            continue
        f = _FRAME.match(line)
        if f and threads:
            lineno = int(f.group(2)) if f.group(2).isdigit() else 0
            threads[-1]["frames"].append({"file": f.group(1), "line": lineno, "func": f.group(3).strip()})
    return threads


def proc_state(pid: int) -> dict[str, Any]:
    """The process's state letter and per-thread ``(tid, state, wchan)`` from ``/proc`` (``{}`` when gone)."""
    out: dict[str, Any] = {}
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return out
    out["state"] = stat.rsplit(")", 1)[1].split()[0]
    tasks = []
    with contextlib.suppress(OSError):
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int)[:64]:
            with contextlib.suppress(OSError):
                tstat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                wchan = ""
                with contextlib.suppress(OSError):
                    wchan = Path(f"/proc/{pid}/task/{tid}/wchan").read_text().strip()
                tasks.append({"tid": int(tid), "state": tstat.rsplit(")", 1)[1].split()[0], "wchan": wchan})
    out["tasks"] = tasks
    return out


def _ready(path: Path, pid: int) -> int | None:
    """The stacks file's size when it belongs to ``pid`` (its hooks are installed), else ``None``."""
    try:
        with path.open("rb") as f:
            head = f.readline()
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    return size if head.strip() == f"# rallypoint stacks pid={pid}".encode() else None


def collect_workers(
    workers: dict[int, tuple[int, int]], debug_dir: Path, *, timeout: float = 1.5
) -> list[dict[str, Any]]:
    """Stacks, flight record and ``/proc`` state of each worker (``rank -> (pid, local_rank)``).

    Every hooked worker is signalled at once; the answers are read as they come, for up to
    ``timeout`` seconds (a dump is written in microseconds; a stopped process never writes).
    """
    pending: dict[int, int] = {}
    for rank, (pid, _local) in workers.items():
        size = _ready(debug_dir / f"rank_{rank}.stacks", pid)
        if size is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, DUMP_SIGNAL)
                pending[rank] = size
    texts: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    sizes: dict[int, int] = {}
    while pending and time.monotonic() < deadline:
        time.sleep(0.01)
        for rank, before in list(pending.items()):
            path = debug_dir / f"rank_{rank}.stacks"
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                if size > before and sizes.get(rank) == size:  # grew, and stopped growing
                    with path.open("rb") as f:
                        f.seek(before)
                        texts[rank] = f.read(size - before).decode("utf-8", "replace")
                    del pending[rank]
                sizes[rank] = size
    out = []
    for rank, (pid, local_rank) in sorted(workers.items()):
        record: dict[str, Any] = {"rank": rank, "local_rank": local_rank, "pid": pid}
        record.update(proc_state(pid))
        record["threads"] = parse_faulthandler(texts[rank]) if rank in texts else []
        record["dumped"] = rank in texts
        record["flight"] = read_flight(debug_dir / f"rank_{rank}.flight")
        out.append(record)
    return out
