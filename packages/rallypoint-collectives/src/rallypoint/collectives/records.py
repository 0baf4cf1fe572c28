"""Registration records of collective backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rallypoint.core.records import BackendRecord, load_object

__all__ = ["Availability", "CollectiveBackendRecord"]


@dataclass(frozen=True)
class Availability:
    """Whether a collective backend can run here, and why (not).

    Attributes:
        available: ``True`` when the backend can initialise a process group on this machine.
        reason: a sentence for people, e.g. ``"no CUDA device is visible"``.
    """

    available: bool
    reason: str


@dataclass(frozen=True, kw_only=True)
class CollectiveBackendRecord(BackendRecord):
    """A torch process-group backend, selected with ``[collectives] backend = "<name>"``.

    Attributes:
        torch_backend: the name torch.distributed knows it by (``"gloo"``, ``"nccl"``).
        device: the device tensors must live on: ``"cpu"`` or ``"cuda"``.
        availability: import path of a zero-argument callable returning :class:`Availability`;
            it may import torch, so it is called only when the backend is considered.
        priority: ``auto`` picks the available backend with the highest priority.
        default_timeout: default collective timeout in seconds for this backend, used when the
            job does not set ``[collectives] timeout``; ``None`` keeps the job default.
    """

    torch_backend: str = ""
    device: Literal["cpu", "cuda"] = "cpu"
    availability: str = ""
    priority: int = 0
    default_timeout: float | None = None

    def check_availability(self) -> Availability:
        """Call the availability check (imports what the backend needs)."""
        if not self.availability:
            return Availability(True, "no availability check declared")
        check = load_object(self.availability)
        result = check()
        if not isinstance(result, Availability):
            raise TypeError(f"{self.availability} returned {result!r}, expected Availability")
        return result
