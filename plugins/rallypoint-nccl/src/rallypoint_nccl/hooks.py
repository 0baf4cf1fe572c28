"""rallypoint hooks of the NCCL plugin."""

from __future__ import annotations

from rallypoint.collectives.records import CollectiveBackendRecord
from rallypoint.core.plugins import hookimpl
from rallypoint.core.records import Requirement


@hookimpl
def rallypoint_collective_backends() -> list[CollectiveBackendRecord]:
    """Register NCCL."""
    return [
        CollectiveBackendRecord(
            name="nccl",
            summary="NCCL: GPU collectives (CUDA builds of torch)",
            torch_backend="nccl",
            device="cuda",
            stream_ordered=True,  # work is queued on CUDA streams; NCCL's watchdog enforces timeouts
            availability="rallypoint_nccl.availability:check",
            priority=20,
            default_timeout=600.0,
            requires=(Requirement(module="torch", install="torch"),),
        )
    ]
