"""``[rendezvous.options]`` of the ``etcd`` backend (pydantic only: no etcd client imported here)."""

from __future__ import annotations

import os
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rallypoint.core.config import file_problem, variable_problem
from rallypoint.core.config.sections import cross_field_error

__all__ = ["DEFAULT_PORT", "EtcdOptions", "parse_endpoint"]

#: etcd's client port when an endpoint names none.
DEFAULT_PORT = 2379
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEGMENT = re.compile(r"^[A-Za-z0-9._~:@+=,-]+$")


def parse_endpoint(text: str) -> tuple[str, int, bool | None]:
    """Split ``[http://|https://]HOST[:PORT]`` into ``(host, port, tls)``.

    ``tls`` is ``True`` for ``https://``, ``False`` for ``http://`` and ``None`` without a scheme.

    Raises:
        ValueError: not a host with an optional port.
    """
    tls: bool | None = None
    rest = text.strip()
    for scheme, flag in (("https://", True), ("http://", False)):
        if rest.startswith(scheme):
            rest, tls = rest[len(scheme) :], flag
    rest = rest.rstrip("/")
    if rest.startswith("["):  # [IPv6]:port
        host, closed, tail = rest[1:].partition("]")
        if not closed or (tail and not tail.startswith(":")):
            raise ValueError(f"etcd endpoint {text!r} is not [IPv6]:PORT (e.g. [::1]:2379): check the brackets")
        port_text = tail[1:]
    else:
        host, _, port_text = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not host or "/" in host or " " in host:
        raise ValueError(f"etcd endpoint {text!r} is not HOST:PORT (e.g. 10.0.0.5:2379 or https://etcd-1:2379)")
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"etcd endpoint {text!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"etcd endpoint {text!r}: port {port} is out of range 1-65535")
    return host, port, tls


class EtcdOptions(BaseModel):
    """``[rendezvous.options]`` of the ``etcd`` backend.

    Attributes:
        endpoints: etcd client endpoints, ``HOST:PORT`` (``http://`` or ``https://`` allowed),
            as a list or one comma-separated string. A request that fails on one goes to the next.
        prefix: every key of rallypoint lives under it (default ``/rallypoint``).
        namespace: an extra path segment under ``prefix`` (e.g. a team or cluster name): runs in
            different namespaces never see each other, even with the same run id.
        connect_timeout: seconds one request to one endpoint may take before it counts as failed.
        retry_timeout: seconds an operation keeps retrying while no endpoint answers (etcd
            restarting, a leader election) before it fails with an error naming the endpoints.
            Keep it at ``heartbeat_timeout`` (the default of both is 10 s).
        key_ttl: seconds the run's keys outlive the last agent that used them when no agent
            cleans up (all killed): they are attached to a lease the agents keep alive.
        tls_ca: CA bundle (PEM) that signed the servers' certificates; turns TLS on.
        tls_cert: client certificate (PEM) for mutual TLS (with ``tls_key``).
        tls_key: the client certificate's private key (PEM).
        username: etcd user (role-based access control).
        password_env: name of the environment variable that holds the user's password (the
            password itself never goes into the job file).
    """

    model_config = ConfigDict(extra="forbid")

    endpoints: Annotated[list[str], Field(min_length=1)] = Field(
        default_factory=lambda: [f"127.0.0.1:{DEFAULT_PORT}"], description="etcd client endpoints HOST:PORT"
    )
    prefix: str = Field(default="/rallypoint", description="key prefix of every rallypoint key")
    namespace: str | None = Field(default=None, description="extra path segment under prefix")
    connect_timeout: float = Field(default=5.0, gt=0, le=300)
    retry_timeout: float = Field(default=10.0, gt=0, le=3600)
    key_ttl: int = Field(default=60, ge=5, le=86400)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    username: str | None = Field(default=None, min_length=1)
    password_env: str | None = Field(default=None, description="environment variable holding the password")

    @field_validator("endpoints", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [part for part in (p.strip() for p in value.split(",")) if part]
        return value

    @field_validator("endpoints")
    @classmethod
    def _check_endpoints(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_endpoint(text)
        return value

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        parts = [p for p in value.split("/") if p]
        bad = [p for p in parts if not _SEGMENT.fullmatch(p) or p in (".", "..")]
        if not value.startswith("/") or bad:
            raise ValueError(
                f"prefix {value!r} must start with '/' and hold segments of letters, digits and . _ ~ : @ + = , -"
            )
        return "/" + "/".join(parts)

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str | None) -> str | None:
        if value is not None and (not _SEGMENT.fullmatch(value) or value in (".", "..")):
            raise ValueError(f"namespace {value!r} must be one segment of letters, digits and . _ ~ : @ + = , -")
        return value

    @field_validator("password_env")
    @classmethod
    def _check_env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError(
                f"password_env {value!r} must be the NAME of an environment variable (letters, digits, _), "
                "not the password"
            )
        return value

    @model_validator(mode="after")
    def _check_pairs(self) -> EtcdOptions:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together (a client certificate and its key)")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("tls_cert needs tls_ca (the CA that signed the etcd servers' certificates)")
        if (self.username is None) != (self.password_env is None):
            raise ValueError("username and password_env go together (the password is read from that variable)")
        schemes = {parse_endpoint(e)[2] for e in self.endpoints} - {None}
        if True in schemes and self.tls_ca is None:
            raise ValueError("https:// endpoints need tls_ca (the CA that signed the etcd servers' certificates)")
        if False in schemes and self.tls_ca is not None:
            raise ValueError("tls_ca is set but an endpoint says http://; use https:// or no scheme")
        self._check_files_and_secrets()
        return self

    def _check_files_and_secrets(self) -> None:
        """The TLS files can be read and the password variable is set: checked with the job, not at start-up."""
        for key, what in (("tls_ca", "CA bundle"), ("tls_cert", "client certificate"), ("tls_key", "client key")):
            path = getattr(self, key)
            problem = None if path is None else file_problem(path, what, pem=True)
            if problem:
                raise cross_field_error(
                    "file",
                    "{problem}; {key} must name a readable PEM file on every node",
                    (key,),
                    problem=problem,
                    key=key,
                )
        if self.password_env is not None:
            problem = variable_problem(self.password_env, f"etcd password of user {self.username!r}", allow_empty=True)
            if problem:
                raise cross_field_error(
                    "variable", "{problem}; export it on every node", ("password_env",), problem=problem
                )

    @property
    def tls(self) -> bool:
        """Whether connections use TLS."""
        return self.tls_ca is not None

    def password(self) -> str | None:
        """The password, read from ``password_env`` now.

        Raises:
            ValueError: the variable is not set.
        """
        if self.password_env is None:
            return None
        value = os.environ.get(self.password_env)
        if value is None:
            raise ValueError(
                f"rendezvous.options.password_env names {self.password_env!r}, which is not set in this "
                f"environment; export it with the etcd password of user {self.username!r}"
            )
        return value

    def base_key(self, run_id: str) -> str:
        """The etcd key under which run ``run_id`` lives (ends with ``/``)."""
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{self.prefix.rstrip('/')}/{ns}{run_id}/"
