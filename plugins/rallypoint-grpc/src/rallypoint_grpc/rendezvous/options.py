"""``[rendezvous.options]`` of the ``grpc`` backend. No grpc import here."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rallypoint_grpc.endpoints import format_endpoint, parse_endpoint
from rallypoint_grpc.security import SecurityOptions

__all__ = ["GrpcOptions"]


class GrpcOptions(SecurityOptions):
    """``[rendezvous.options]`` of the ``grpc`` backend.

    Attributes:
        endpoint: ``HOST:PORT`` of the rendezvous server, the same on every node.
        serve: ``"auto"``: the agent on the host that owns the endpoint's address starts the
            server in-process, bound to that address only (the first agent to bind serves, the
            others connect); ``"never"``: only connect (a standalone ``rallypoint rdzv serve``).
        token_file: file whose first line is the shared token; every call carries it.
        token_env: environment variable that holds the token (instead of ``token_file``).
        tls_ca: CA certificate (PEM) that verifies the server; setting it turns TLS on.
        tls_cert: PEM certificate: the server's when this agent hosts it, and this node's
            client certificate when ``mutual_tls`` is set.
        tls_key: the private key (PEM) of ``tls_cert``.
        mutual_tls: the hosted server requires client certificates signed by ``tls_ca``, and
            clients present ``tls_cert``.
        tls_server_name: the name checked against the server's certificate (default: the
            endpoint's host).
        data_dir: the hosting agent persists the state here (survives a server restart).
        call_timeout: deadline of each call, in seconds.
        retry_timeout: how long a call retries an unreachable server (with backoff) before it
            fails with ``RendezvousBackendError``; keep it under ``heartbeat_timeout``.
        max_message_bytes: largest request or reply.
        linger: the hosting agent keeps serving at exit until the others have been quiet for a
            second, at most this many seconds.
    """

    endpoint: str = Field(description="HOST:PORT of the rendezvous server")
    serve: Literal["auto", "never"] = "auto"
    data_dir: str | None = None
    call_timeout: float = Field(default=10.0, gt=0, le=3600)
    retry_timeout: float = Field(default=5.0, ge=0, le=3600)
    max_message_bytes: int = Field(default=4 << 20, ge=4096, le=1 << 30)
    linger: float = Field(default=10.0, ge=0, le=600)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        host, port = parse_endpoint(value)
        if port == 0:
            raise ValueError("the endpoint needs a fixed port (every node must know it), not 0")
        return format_endpoint(host, port)

    def _check_tls(self) -> None:
        if self.mutual_tls and (self.tls_ca is None or self.tls_cert is None):
            raise ValueError("mutual_tls needs tls_ca, tls_cert and tls_key")

    @property
    def tls(self) -> bool:
        """Whether the connection uses TLS."""
        return self.tls_ca is not None
