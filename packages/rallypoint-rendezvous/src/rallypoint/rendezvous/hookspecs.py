"""Hook specifications of ``rallypoint-rendezvous``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rallypoint.core.plugins import hookspec
from rallypoint.rendezvous.records import RendezvousBackendRecord

if TYPE_CHECKING:
    from rallypoint.rendezvous.errors import TimeoutInfo
    from rallypoint.rendezvous.round_io import RendezvousResult


@hookspec
def rallypoint_rendezvous_backends() -> Iterable[RendezvousBackendRecord]:
    """Register rendezvous backends.

    Returns:
        :class:`~rallypoint.rendezvous.records.RendezvousBackendRecord` records. Users select one
        by name with ``[rendezvous] backend``; its ``options_model`` validates
        ``[rendezvous.options]``.

    Example::

        @hookimpl
        def rallypoint_rendezvous_backends():
            return [RendezvousBackendRecord(name="redis", summary="Redis streams",
                                            factory="rp_redis.backend:RedisBackend",
                                            options_model=RedisOptions)]
    """
    return ()


@hookspec
def rallypoint_rendezvous_completed(info: RendezvousResult) -> None:
    """Called on each agent when a rendezvous round completes and this node is in it.

    Args:
        info: the :class:`~rallypoint.rendezvous.round_io.RendezvousResult` (run id, round,
            this node's group rank, the participants in group-rank order, the workers' store).
    """


@hookspec
def rallypoint_rendezvous_timed_out(info: TimeoutInfo) -> None:
    """Called when a rendezvous timeout expires, before the timeout error is raised.

    This is the place for custom timeout handling (alerting, releasing reservations).

    Args:
        info: the :class:`~rallypoint.rendezvous.errors.TimeoutInfo`: which timeout, its value,
            the nodes present and the nodes missing.
    """
