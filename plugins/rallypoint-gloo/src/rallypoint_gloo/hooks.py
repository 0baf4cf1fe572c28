"""rallypoint hooks of the Gloo plugin."""

from __future__ import annotations

from rallypoint.collectives.records import CollectiveBackendRecord
from rallypoint.core.plugins import hookimpl
from rallypoint.core.records import Requirement


@hookimpl
def rallypoint_collective_backends() -> list[CollectiveBackendRecord]:
    """Register Gloo."""
    return [
        CollectiveBackendRecord(
            name="gloo",
            summary="Gloo: CPU collectives over TCP (torch built-in)",
            torch_backend="gloo",
            device="cpu",
            stream_ordered=False,  # the CPU waits for Gloo's work: the facade times each call
            availability="rallypoint_gloo.availability:check",
            priority=10,
            requires=(Requirement(module="torch", install="torch"),),
        )
    ]
