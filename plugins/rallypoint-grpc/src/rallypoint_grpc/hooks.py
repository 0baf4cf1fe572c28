"""rallypoint hooks of the grpc plugin: both wings, registered here.

The rendezvous wing (:mod:`rallypoint_grpc.rendezvous`) gives the ``grpc`` rendezvous backend and
``rallypoint rdzv``; the RPC wing (:mod:`rallypoint_grpc.rpc`) the ``grpc`` RPC transport.
Nothing heavy is imported here (no grpc): the backend, server and transport modules load only
when one is selected or the command runs.
"""

from __future__ import annotations

from rallypoint.core.plugins import hookimpl
from rallypoint.core.records import CliCommand
from rallypoint.rendezvous.records import RendezvousBackendRecord


@hookimpl
def rallypoint_rendezvous_backends() -> list[RendezvousBackendRecord]:
    """The ``grpc`` backend: a rendezvous server that any agent can host, or a standalone one."""
    from rallypoint_grpc.rendezvous.options import GrpcOptions

    return [
        RendezvousBackendRecord(
            name="grpc",
            summary="gRPC server (agent-hosted or `rallypoint rdzv serve`), streaming watches",
            factory="rallypoint_grpc.rendezvous.backend:create_grpc_backend",
            options_model=GrpcOptions,
            endpoint_option="endpoint",
        )
    ]


@hookimpl
def rallypoint_cli_commands() -> list[CliCommand]:
    """``rallypoint rdzv serve``."""
    return [
        CliCommand(
            name="rdzv",
            summary="Run a standalone gRPC rendezvous server (rdzv serve).",
            command="rallypoint_grpc.rendezvous.cli:rdzv",
        )
    ]


@hookimpl
def rallypoint_rpc_transports() -> list[object]:
    """The ``grpc`` RPC transport (:mod:`rallypoint_grpc.rpc.transport`)."""
    from rallypoint.rpc.records import RpcTransportRecord
    from rallypoint_grpc.rpc.options import GrpcRpcOptions

    return [
        RpcTransportRecord(
            name="grpc",
            summary="gRPC (token on every call, optional TLS), raw tensor buffers",
            factory="rallypoint_grpc.rpc.transport:create_grpc_rpc_transport",
            options_model=GrpcRpcOptions,
        )
    ]
