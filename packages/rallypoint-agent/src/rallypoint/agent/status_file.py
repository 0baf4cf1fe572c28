"""``status.json`` in the log directory: what ``rallypoint status`` shows of a job whose rendezvous lives in its agent.

A job on one machine keeps its rendezvous in the agent's memory (the ``memory`` backend), and an
agent that hosts the gRPC server for its job (``c10d`` without a data directory) takes the job's
state with it when it ends. Nothing outside that process can read it, so such an agent writes
the same snapshot ``status`` would read (:func:`rallypoint.agent.status_view.snapshot`) into
``<log dir>/status.json`` whenever it changes: when a round starts, after each attempt, and when
the job ends. ``rallypoint status`` reads it from there (:func:`find`).

The file is private (``0600``, like the logs beside it) and replaced atomically: a reader never
sees half of it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rallypoint.agent.status_view import snapshot

if TYPE_CHECKING:
    from rallypoint.rendezvous.backend import RendezvousBackend

__all__ = ["NAME", "StatusFile", "find", "keeps_state_here", "read"]

log = logging.getLogger("rallypoint.agent.status")

#: The file's name in the log directory.
NAME = "status.json"


def keeps_state_here(backend: RendezvousBackend) -> bool:
    """Whether the job's rendezvous state lives in this process only (a backend's ``local_state``)."""
    return bool(getattr(backend, "local_state", False))


class StatusFile:
    """Writes a job's status snapshot into ``<log_dir>/status.json`` when it changed.

    Args:
        backend: the job's rendezvous backend (read only).
        run_id: the job's run id.
        log_dir: the job's log directory (claimed by the agent).
    """

    def __init__(self, backend: RendezvousBackend, run_id: str, log_dir: Path) -> None:
        self.backend, self.run_id, self.path = backend, run_id, log_dir / NAME
        self._last: str | None = None

    def update(self) -> None:
        """Write the snapshot if it changed since the last write (never raises: status is a view)."""
        try:
            snap = snapshot(self.backend, self.run_id)
            if snap is None:
                return
            text = json.dumps(snap, indent=2, sort_keys=True)
            if text == self._last:
                return
            part = self.path.with_name(f".{NAME}.{os.getpid()}")
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with open(fd, "w") as f:
                f.write(text + "\n")
            os.replace(part, self.path)
            self._last = text
        except Exception as exc:  # noqa: BLE001 - a full disk or a gone directory must not stop the job
            log.debug("status file %s: %s", self.path, exc)


def read(path: Path) -> dict[str, Any] | None:
    """The snapshot in ``path``; ``None`` when there is none (yet) or it cannot be read."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    # JSON object keys are strings: the ranks table is keyed by int, as snapshot() returns it
    data["ranks"] = {int(r): state for r, state in dict(data.get("ranks") or {}).items()}
    return data


def find(template: str, run_id: str | None, job_name: str) -> tuple[Path | None, list[Path]]:
    """The status file of ``run_id`` under the log directory ``template``, or the newest one.

    Args:
        template: ``agent.log_dir`` (``{run_id}`` and ``{job}`` filled in).
        run_id: the run to show; ``None``: the most recently updated job under the template.
        job_name: the job's name (``{job}``).

    Returns:
        the file (``None``: none found) and every status file the template matched (newest first).
    """
    if run_id is not None:
        path = Path(template.format(run_id=run_id, job=job_name)) / NAME
        return (path if path.is_file() else None), [path] if path.is_file() else []
    pattern = Path(template.format(run_id="*", job=job_name)) / NAME
    anchor = Path(pattern.anchor) if pattern.is_absolute() else Path()
    found = sorted(
        (p for p in anchor.glob(str(pattern.relative_to(anchor))) if p.is_file()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    return (found[0] if found else None), found
