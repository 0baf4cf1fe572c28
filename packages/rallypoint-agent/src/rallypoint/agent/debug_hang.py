"""The hang report: made by the agent that saw a hang, before it acts, and kept by every node.

When a watchdog scope expires, the agent that serves it asks every agent of the job for its
workers (:func:`~rallypoint.agent.debug_service.request`, flagged as a hang), gathers the
answers, renders the same report as ``rallypoint debug stacks`` and writes it as
``hang_report.txt`` (and ``hang_report.json``) in its log directory, next to ``failure.json``. It
also publishes the report under ``debug/hang/<request>``: every other agent, having answered
the request, waits for it and writes it into its own log directory. The diagnosis line goes into
the failure's reason, so the failure report every node prints carries it.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rallypoint.agent.debug_report import flatten, render
from rallypoint.rendezvous.keyspace import debug_hang_key

if TYPE_CHECKING:
    from rallypoint.rendezvous.backend import RendezvousBackend

__all__ = ["REPORT_NAME", "keep_report", "make_report", "write_report"]

#: The report's file name in the log directory.
REPORT_NAME = "hang_report.txt"


def write_report(log_dir: Path, report: dict[str, Any]) -> Path | None:
    """Write ``report`` (``why``, ``text``, ``diagnosis``, ``workers``) into ``log_dir``; its path, or ``None``."""
    path = log_dir / REPORT_NAME
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.get("time", time.time())))
        path.write_text(f"{report['why']} ({stamp})\n\n{report['text']}\n")
        path.with_suffix(".json").write_text(json.dumps(report, indent=1))
    except OSError:
        return None
    return path


def make_report(
    backend: RendezvousBackend, rid: str, why: str, answers: list[dict[str, Any]], missing: list[str]
) -> dict[str, Any]:
    """The report of the answers to request ``rid``, published for the other nodes."""
    text = render(answers, missing)
    report = {"request": rid, "why": why, "time": time.time(), "text": text, "diagnosis": text.splitlines()[-1]}
    with contextlib.suppress(Exception):  # the local report stands without the backend
        backend.set(debug_hang_key(rid), {k: v for k, v in report.items()})
    report["workers"] = flatten(answers)
    return report


def keep_report(backend: RendezvousBackend, rid: str, log_dir: Path, *, timeout: float = 15.0) -> str | None:
    """Wait for the hang report of request ``rid`` and write it into ``log_dir``; its diagnosis line."""
    key = debug_hang_key(rid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entry = backend.get(key)
        if entry is not None and isinstance(entry.value, dict):
            write_report(log_dir, entry.value)
            return str(entry.value.get("diagnosis") or "")
        backend.watch(key, version=None, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
    return None
