"""Hook specifications of ``rallypoint-rpc``."""

from __future__ import annotations

from collections.abc import Iterable

from rallypoint.core.plugins import hookspec
from rallypoint.rpc.records import RpcTransportRecord


@hookspec
def rallypoint_rpc_transports() -> Iterable[RpcTransportRecord]:
    """Register RPC transports.

    Returns:
        :class:`~rallypoint.rpc.records.RpcTransportRecord` records, selected by
        ``[rpc] transport``.

    Example::

        @hookimpl
        def rallypoint_rpc_transports():
            return [RpcTransportRecord(name="shm", factory="my_rpc.shm:SharedMemoryTransport")]
    """
    return ()
