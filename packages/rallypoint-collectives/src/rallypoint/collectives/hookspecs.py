"""Hook specifications of ``rallypoint-collectives``."""

from __future__ import annotations

from collections.abc import Iterable

from rallypoint.collectives.records import CollectiveBackendRecord
from rallypoint.core.plugins import hookspec


@hookspec
def rallypoint_collective_backends() -> Iterable[CollectiveBackendRecord]:
    """Register torch process-group backends.

    Returns:
        :class:`~rallypoint.collectives.records.CollectiveBackendRecord` records, selected by
        ``[collectives] backend`` (``auto`` picks the available one with the highest priority).

    Example::

        @hookimpl
        def rallypoint_collective_backends():
            return [CollectiveBackendRecord(name="ucc", torch_backend="ucc", device="cuda",
                                            availability="my_ucc:check")]
    """
    return ()
