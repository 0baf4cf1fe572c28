"""The rendezvous package as a rallypoint plugin: adds its hook specifications and the ``memory`` backend."""

from __future__ import annotations

import pluggy

from rallypoint.core.plugins import hookimpl
from rallypoint.rendezvous.records import RendezvousBackendRecord


@hookimpl
def rallypoint_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Make the rendezvous hooks known."""
    from rallypoint.rendezvous import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def rallypoint_rendezvous_backends() -> list[RendezvousBackendRecord]:
    """The built-in ``memory`` backend (in-process; for tests and single-node jobs)."""
    from rallypoint.rendezvous.memory import MemoryOptions

    return [
        RendezvousBackendRecord(
            name="memory",
            summary="in-process key-value space (tests, single node)",
            factory="rallypoint.rendezvous.memory:create_memory_backend",
            options_model=MemoryOptions,
            multi_host=False,
        )
    ]
