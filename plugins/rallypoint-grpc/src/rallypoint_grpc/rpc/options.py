"""``[rpc.options]`` of the ``grpc`` RPC transport. No grpc import here."""

from __future__ import annotations

from pydantic import Field

from rallypoint_grpc.security import SecurityOptions

__all__ = ["GrpcRpcOptions"]


class GrpcRpcOptions(SecurityOptions):
    """``[rpc.options]`` when ``[rpc] transport = "grpc"``.

    Attributes:
        token_file: file whose first line is the token every call must carry (default: a
            token made per job by rank 0 and shared through the job's store).
        token_env: environment variable that holds the token (instead of ``token_file``).
        tls_ca: CA certificate (PEM) that verifies the peers; setting it turns TLS on.
        tls_cert: this worker's certificate (PEM), served to peers (and presented as a client
            certificate with ``mutual_tls``).
        tls_key: the private key (PEM) of ``tls_cert``.
        mutual_tls: servers require client certificates signed by ``tls_ca``.
        tls_server_name: the name checked against the peers' certificates (default: their address).
        max_message_bytes: largest request or reply (arguments and results of one call).
        chunk_bytes: frames larger than this travel in chunks of this size over a streaming
            call (between hosts, or without the same-host path); at most ``max_message_bytes``.
        max_frame_bytes: largest frame (arguments or result of one call) in chunks.
        same_host_shm: the same-host path: between workers of one host, calls travel over a
            Unix socket (with ``sockets``), or frames of 64 KiB or more through files in
            ``/dev/shm`` (gRPC calls then only name them).
        sockets: after a first gRPC call, calls to a peer travel over one persistent socket per
            pair of workers (token checked on every call; TCP between hosts only without TLS,
            a private Unix socket on one host); off: every call is a gRPC call.
    """

    max_message_bytes: int = Field(default=512 << 20, ge=4096, le=(2 << 30) - 1)
    chunk_bytes: int = Field(default=4 << 20, ge=4096, le=(2 << 30) - 1)
    max_frame_bytes: int = Field(default=16 << 30, ge=4096)
    same_host_shm: bool = True
    sockets: bool = True

    def _check_tls(self) -> None:
        if self.tls_ca is not None and self.tls_cert is None:
            raise ValueError("TLS (tls_ca) needs tls_cert and tls_key: every worker also serves")
        if self.mutual_tls and self.tls_ca is None:
            raise ValueError("mutual_tls needs tls_ca, tls_cert and tls_key")
