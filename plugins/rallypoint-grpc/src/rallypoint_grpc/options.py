"""``[rendezvous.options]`` of the ``grpc`` backend, and endpoint parsing. No grpc import here."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rallypoint.core.config import file_problem, variable_problem
from rallypoint.core.config.sections import cross_field_error

__all__ = ["GrpcOptions", "check_files", "format_endpoint", "parse_endpoint"]

#: The options that name a file read at start-up: key, what the file is, whether it is PEM.
_FILES = (
    ("tls_ca", "CA certificate", True),
    ("tls_cert", "TLS certificate", True),
    ("tls_key", "TLS key", True),
    ("token_file", "token file", False),
)


class _FileOptions(Protocol):
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    token_file: str | None
    token_env: str | None


def check_files(options: _FileOptions) -> None:
    """Refuse options naming a file that cannot be read, or an unset token variable (located at its key).

    Checked with the job (``config check``, ``run`` before anything starts), not when a node
    first reads the file.

    Raises:
        pydantic_core.PydanticCustomError: the first such option, at its key.
    """
    for key, what, pem in _FILES:
        path = getattr(options, key)
        problem = None if path is None else file_problem(path, what, pem=pem)
        if problem:
            kind = "a readable PEM file" if pem else "a readable file"
            raise cross_field_error(
                "file",
                "{problem}; {key} must name {expected} on every node",
                (key,),
                problem=problem,
                key=key,
                expected=kind,
            )
    if options.token_env is not None:
        problem = variable_problem(options.token_env, "token")
        if problem:
            raise cross_field_error(
                "variable", "{problem}; export it, with the same token, on every node", ("token_env",), problem=problem
            )


def parse_endpoint(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (or ``[IPv6]:PORT``) into host and port.

    Raises:
        ValueError: no port, a port outside 0-65535, or an empty host.
    """
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid endpoint {text!r}: expected HOST:PORT (e.g. node0:29400 or [::1]:29400)")
    return host, int(port)


def format_endpoint(host: str, port: int) -> str:
    """``HOST:PORT``, with brackets around an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcOptions(BaseModel):
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

    model_config = ConfigDict(extra="forbid")

    endpoint: str = Field(description="HOST:PORT of the rendezvous server")
    serve: Literal["auto", "never"] = "auto"
    token_file: str | None = None
    token_env: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    mutual_tls: bool = False
    tls_server_name: str | None = None
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

    @model_validator(mode="after")
    def _consistent(self) -> GrpcOptions:
        if self.token_file is not None and self.token_env is not None:
            raise ValueError("give token_file or token_env, not both")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.mutual_tls and (self.tls_ca is None or self.tls_cert is None):
            raise ValueError("mutual_tls needs tls_ca, tls_cert and tls_key")
        check_files(self)
        return self

    @property
    def tls(self) -> bool:
        """Whether the connection uses TLS."""
        return self.tls_ca is not None
