"""``[rendezvous.options]`` of the ``file`` backend, checked with the job (no backend imported here).

``path`` must name a directory this user can create the run's directory in: an empty path, a
path under a file that is not a directory, or a file system that refuses new directories
(``/proc``, a read-only mount) is a configuration error at ``rendezvous.options.path``, found
by ``config check`` and by ``run`` before anything starts, rather than when the first node
opens the backend.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rallypoint.core.config.sections import cross_field_error

__all__ = ["FileOptions", "path_problem"]


def _nearest_existing(path: Path) -> Path:
    """``path`` itself, or its closest ancestor that exists (the directory new ones are made in)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor or ".")


def path_problem(path: str) -> str | None:
    """Why the backend could not create its run directory under ``path``, or ``None`` when it can.

    Creates and removes an empty directory with a unique name in the closest existing directory
    of ``path``: only trying shows that a file system takes new directories (root may write
    anywhere by its permissions, yet not in ``/proc/sys``).
    """
    target = Path(path).absolute()
    try:
        existing = _nearest_existing(target)
        if not existing.is_dir():
            return f"{existing} is not a directory"
        probe = tempfile.mkdtemp(prefix=".rallypoint-probe-", dir=existing)
        os.rmdir(probe)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return f"cannot create a directory in {existing}: {why}"
    return None


class FileOptions(BaseModel):
    """``[rendezvous.options]`` of the ``file`` backend.

    Attributes:
        path: a directory every node can reach (a shared file system for several hosts);
            created (mode 0700) if missing. Each run id gets a subdirectory.
        poll_interval: the longest pause between two looks at a watched file, in seconds.
        group: a group (name or number) whose members may share the run directory: it is
            created group-owned with mode 2770, its files 0660, and files owned by that group are
            accepted. Without it the run directory is private to the current user.
        read_only: open an existing run directory to read it only (``rallypoint status``):
            nothing is created, a missing run directory is an error, writes are refused.
    """

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="directory on a file system shared by every node")
    poll_interval: float = Field(default=0.01, gt=0, le=5)
    group: str | None = Field(default=None, min_length=1, description="group that may share the run directory")
    read_only: bool = Field(default=False, description="read an existing run directory, create and write nothing")

    @field_validator("path")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the path is empty; give a directory every node can reach (e.g. /shared/rdzv)")
        return value

    @model_validator(mode="after")
    def _creatable(self) -> FileOptions:
        if self.read_only:  # nothing is created: a missing run directory is the backend's error
            return self
        problem = path_problem(self.path)
        if problem:
            raise cross_field_error(
                "path",
                "{problem}; give a directory this user can write, on a file system every node shares",
                ("path",),
                problem=problem,
            )
        return self
