"""Registration records of collective backends, and what a backend's factory is handed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rallypoint.core.records import BackendRecord, load_object
from rallypoint.core.registry import PluginKind, SpecialValue

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["COLLECTIVE_BACKENDS", "Availability", "BackendContext", "CollectiveBackendRecord"]


@dataclass(frozen=True)
class Availability:
    """Whether a collective backend can run here, and why (not).

    Attributes:
        available: ``True`` when the backend can initialise a process group on this machine.
        reason: a sentence for people, e.g. ``"no CUDA device is visible"``.
    """

    available: bool
    reason: str


@dataclass(frozen=True)
class BackendContext:
    """What :func:`rallypoint.collectives.init` hands a backend's factory.

    A backend record may name a ``factory``: a callable taking one ``BackendContext`` and
    returning the ``pg_options`` object for ``torch.distributed.init_process_group`` (or ``None``
    for torch's defaults). It is called once per worker, just before the default process group is
    created; it may also register a torch backend of its own there.

    Attributes:
        options: the backend's validated options (an instance of the record's ``options_model``,
            built from ``[collectives.options]``), or ``None`` when the record declares no model.
        rank: this worker's global rank.
        world_size: the number of workers.
        device: the ``torch.device`` this worker is bound to (CUDA backends), else ``None``.
        timeout: the process group's timeout in seconds.
    """

    options: BaseModel | None
    rank: int
    world_size: int
    device: Any
    timeout: float


@dataclass(frozen=True, kw_only=True)
class CollectiveBackendRecord(BackendRecord):
    """A torch process-group backend, selected with ``[collectives] backend = "<name>"``.

    Attributes:
        torch_backend: the name torch.distributed knows it by (``"gloo"``, ``"nccl"``).
        device: the device tensors must live on: ``"cpu"`` or ``"cuda"``. A CUDA backend binds
            each worker to GPU ``LOCAL_RANK`` (modulo the visible devices).
        stream_ordered: ``True`` when the backend queues work on device streams, so the CPU
            does not wait for a call to complete and the backend's own watchdog enforces the
            process group's timeout (NCCL). ``False`` for backends whose work the CPU waits for
            (Gloo): the facade then times their calls itself.
        availability: import path of a zero-argument callable returning :class:`Availability`;
            it may import torch, so it is called only when the backend is considered.
        priority: ``auto`` picks the available backend with the highest priority.
        default_timeout: default collective timeout in seconds for this backend, used when the
            job does not set ``[collectives] timeout``; ``None`` keeps the job default.

    ``options_model`` (inherited) validates ``[collectives.options]``; the instance reaches the
    record's ``factory`` (inherited; see :class:`BackendContext`) in every worker.
    """

    torch_backend: str = ""
    device: Literal["cpu", "cuda"] = "cpu"
    stream_ordered: bool = False
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

    @property
    def torch_name(self) -> str:
        """The backend name given to torch (``torch_backend``, else ``name``)."""
        return self.torch_backend or self.name


#: The collective-backend kind, declared by this package: ``pm.registry(COLLECTIVE_BACKENDS)``.
#: ``collectives.backend = "auto"`` is not a backend name: each worker picks the usable backend
#: with the highest priority at run time.
COLLECTIVE_BACKENDS: PluginKind[CollectiveBackendRecord] = PluginKind(
    hook="rallypoint_collective_backends",
    label="collective backend",
    record_class=CollectiveBackendRecord,
    config_key="collectives.backend",
    special=(SpecialValue("auto", "picked at run time", needs_plugin=True),),
    install_hint="pip install rallypoint-gloo",
)
