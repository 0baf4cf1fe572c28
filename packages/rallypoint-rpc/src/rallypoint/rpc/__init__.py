"""rallypoint RPC: ``rpc_sync``, ``rpc_async``, ``remote`` and RRefs over pluggable transports.

Hook specifications live in :mod:`rallypoint.rpc.hookspecs`.
"""

from rallypoint.rpc.records import RpcTransportRecord

__all__ = ["RpcTransportRecord"]
