"""Registration records of rendezvous backends."""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.core.records import BackendRecord
from rallypoint.core.registry import PluginKind

__all__ = ["RENDEZVOUS_BACKENDS", "RendezvousBackendRecord"]


@dataclass(frozen=True, kw_only=True)
class RendezvousBackendRecord(BackendRecord):
    """A rendezvous backend, selected with ``[rendezvous] backend = "<name>"``.

    Attributes:
        factory: import path of a callable ``(run_id, options) -> backend`` returning an object
            that implements the rendezvous backend protocol (a key-value space scoped by run_id).
        options_model: pydantic model of ``[rendezvous.options]``.
        multi_host: whether agents on different hosts can share it (``memory`` cannot).
        endpoint_option: the option that torchrun-style ``--rdzv-endpoint VALUE`` sets, e.g.
            ``"path"`` for the file backend; ``None`` when the backend takes no endpoint.
    """

    multi_host: bool = True
    endpoint_option: str | None = None


#: The rendezvous-backend kind, declared by this package: ``pm.registry(RENDEZVOUS_BACKENDS)``.
RENDEZVOUS_BACKENDS: PluginKind[RendezvousBackendRecord] = PluginKind(
    hook="rallypoint_rendezvous_backends",
    label="rendezvous backend",
    record_class=RendezvousBackendRecord,
    config_key="rendezvous.backend",
)
