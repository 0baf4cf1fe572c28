"""Options models (``[timer.options]``) of the built-in watchdog backends."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

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
        path: the FIFO to create; default ``<run_dir>/watchdog.fifo``.
    """

    path: str | None = None
