"""Options models (``[timer.options]``) of the built-in watchdog backends."""

from __future__ import annotations

import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["FileOptions", "LocalOptions"]


class LocalOptions(BaseModel):
    """``[timer.options]`` of the ``local`` watchdog.

    Attributes:
        gc_interval: seconds between sweeps that forget timers of processes that are gone.
    """

    model_config = ConfigDict(extra="forbid")

    gc_interval: float = Field(default=1.0, gt=0)


class FileOptions(LocalOptions):
    """``[timer.options]`` of the ``file`` watchdog.

    Attributes:
        path: the FIFO to create; default ``<run_dir>/watchdog.fifo``. A FIFO already there is
            replaced; anything else there is refused (it would be deleted).
    """

    path: str | None = None

    @field_validator("path")
    @classmethod
    def _not_a_file(cls, value: str | None) -> str | None:
        """The server replaces a FIFO left at ``path``; anything else there is someone's file."""
        if value is None:
            return None
        if not value.strip():
            raise ValueError("is empty; give the path of the FIFO to create, or leave path out")
        try:
            mode = Path(value).lstat().st_mode
        except OSError:
            return value  # nothing there (or unreadable): the server creates the FIFO or says why not
        if not stat.S_ISFIFO(mode):
            raise ValueError(f"{value} exists and is not a FIFO; give a path where nothing is, or leave path out")
        return value
