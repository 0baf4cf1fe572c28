"""Hook specifications of ``rallypoint-rendezvous``.

The lifecycle hooks receive typed records exported by :mod:`rallypoint.rendezvous`:
:class:`~rallypoint.rendezvous.round_io.RendezvousResult` and
:class:`~rallypoint.rendezvous.errors.TimeoutInfo`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rallypoint.core.plugins import hookspec
from rallypoint.rendezvous.records import RendezvousBackendRecord

if TYPE_CHECKING:
    from rallypoint.rendezvous.errors import TimeoutAnswer, TimeoutInfo
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

    Example::

        @hookimpl
        def rallypoint_rendezvous_completed(info):
            hosts = [p.host for p in info.participants]
            log.info("round %d: %d nodes %s, I am %d", info.round, info.num_nodes, hosts, info.group_rank)
    """


@hookspec
def rallypoint_rendezvous_timed_out(info: TimeoutInfo) -> TimeoutAnswer | None:
    """Called when a rendezvous timeout (join or close) expires, before the timeout error is raised.

    This is the place for custom timeout handling (alerting, releasing reservations), and for
    deciding to wait longer.

    Args:
        info: the :class:`~rallypoint.rendezvous.errors.TimeoutInfo`: which timeout, its value,
            the nodes present and the nodes missing.

    Returns:
        ``None`` (no opinion; what hooks written before answers existed return),
        :class:`~rallypoint.rendezvous.errors.WaitMore` ``(seconds)``: keep waiting that long
        (the node stays in the round; cut to ``MAX_WAIT_MORE`` = 3600 s, at most
        ``MAX_WAIT_MORE_TIMES`` = 10 times per wait), or
        :class:`~rallypoint.rendezvous.errors.GiveUp` ``()``: raise the timeout error now. A
        ``GiveUp`` from any plugin wins over ``WaitMore`` answers; with only ``None`` answers
        the error is raised. The hook fires again when the extension expires.

    Example::

        @hookimpl
        def rallypoint_rendezvous_timed_out(info):
            if info.timeout == "join" and len(info.present) >= info.min_nodes - 1:
                return WaitMore(120)  # one node short: give the scheduler two more minutes
            page_oncall(f"rendezvous {info.run_id}: missing {info.missing}")
            return None
    """
