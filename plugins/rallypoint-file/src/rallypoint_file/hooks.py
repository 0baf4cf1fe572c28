"""rallypoint hooks of the file plugin: registers the ``file`` rendezvous backend.

Nothing heavy is imported here: the backend module loads only when the backend is selected.
"""

from __future__ import annotations

from rallypoint.core.plugins import hookimpl
from rallypoint.rendezvous.records import RendezvousBackendRecord


@hookimpl
def rallypoint_rendezvous_backends() -> list[RendezvousBackendRecord]:
    """The ``file`` backend: fcntl locks on a directory shared by every node."""
    from rallypoint_file.options import FileOptions

    return [
        RendezvousBackendRecord(
            name="file",
            summary="files on a shared file system, fcntl locks",
            factory="rallypoint_file.backend:create_file_backend",
            options_model=FileOptions,
            endpoint_option="path",
        )
    ]
