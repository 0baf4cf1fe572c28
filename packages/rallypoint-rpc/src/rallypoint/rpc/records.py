"""Registration records of RPC transports."""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.core.records import BackendRecord
from rallypoint.core.registry import PluginKind

__all__ = ["RPC_TRANSPORTS", "RpcTransportRecord"]


@dataclass(frozen=True, kw_only=True)
class RpcTransportRecord(BackendRecord):
    """An RPC transport, selected with ``[rpc] transport = "<name>"``.

    Attributes:
        factory: import path of the transport (server and client for one worker).
        options_model: pydantic model of ``[rpc.options]`` (addresses, token, TLS files).
    """


#: The RPC-transport kind, declared by this package: ``pm.registry(RPC_TRANSPORTS)``.
RPC_TRANSPORTS: PluginKind[RpcTransportRecord] = PluginKind(
    hook="rallypoint_rpc_transports",
    label="RPC transport",
    record_class=RpcTransportRecord,
    config_key="rpc.transport",
    install_hint="pip install rallypoint-grpc (the grpc transport), or pip install rallypoint (batteries included)",
)
