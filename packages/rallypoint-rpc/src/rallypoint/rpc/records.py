"""Registration records of RPC transports."""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.core.records import BackendRecord

__all__ = ["RpcTransportRecord"]


@dataclass(frozen=True, kw_only=True)
class RpcTransportRecord(BackendRecord):
    """An RPC transport, selected with ``[rpc] transport = "<name>"``.

    Attributes:
        factory: import path of the transport (server and client for one worker).
        options_model: pydantic model of ``[rpc.options]`` (addresses, token, TLS files).
    """
