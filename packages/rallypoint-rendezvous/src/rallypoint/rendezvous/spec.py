"""What a node needs to join a job's rendezvous, as one value: the backend and the job's terms.

A :class:`RendezvousSpec` is decided once (by the agent's plan, or by a library user) and opened
with :meth:`RendezvousHandler.from_spec <rallypoint.rendezvous.handler.RendezvousHandler.from_spec>`.
It holds no connection: building one does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rallypoint.rendezvous.factory import backend_record
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

if TYPE_CHECKING:
    from rallypoint.core.config import Selection
    from rallypoint.rendezvous.records import RendezvousBackendRecord

__all__ = ["RendezvousSpec"]


@dataclass(frozen=True)
class RendezvousSpec:
    """How a node joins the rendezvous of one job.

    Attributes:
        backend: the resolved ``rendezvous.backend`` selection (record and validated options);
            its options are the ones this run uses.
        run_id: the job's run id.
        min_nodes: ``nodes.min``.
        max_nodes: ``nodes.max`` (``min`` when unset).
        timeouts: the ``[rendezvous]`` timeouts.
        fingerprint: what the job runs, as JSON; the rendezvous refuses a node whose fingerprint
            differs from the one the job's first node published (empty: not checked).
    """

    backend: Selection
    run_id: str
    min_nodes: int
    max_nodes: int
    timeouts: RendezvousTimeouts = field(default_factory=RendezvousTimeouts)
    fingerprint: Mapping[str, Any] = field(default_factory=dict)

    @property
    def record(self) -> RendezvousBackendRecord:
        """The backend's registration record."""
        return backend_record(self.backend)
