"""The token and TLS options of both wings: one model both option models extend, and its file checks.

``[rendezvous.options]`` of the ``grpc`` backend and ``[rpc.options]`` of the ``grpc`` transport
take the same seven keys for the token and TLS, checked the same way; only what TLS needs beside
``tls_ca`` differs (every RPC worker also serves), and each wing's model says that in its
``_check_tls``. No grpc import here.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, model_validator

from rallypoint.core.config import file_problem, variable_problem
from rallypoint.core.config.sections import cross_field_error

__all__ = ["SecurityOptions", "check_files"]

#: The options that name a file read at start-up: key, what the file is, whether it is PEM.
_FILES = (
    ("tls_ca", "CA certificate", True),
    ("tls_cert", "TLS certificate", True),
    ("tls_key", "TLS key", True),
    ("token_file", "token file", False),
)


def check_files(options: SecurityOptions) -> None:
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


class SecurityOptions(BaseModel):
    """The token and TLS keys shared by ``[rendezvous.options]`` and ``[rpc.options]`` of gRPC.

    A wing's options model extends it with its own keys, and overrides ``_check_tls`` when
    its TLS needs more than a pair of certificate and key.

    Attributes:
        token_file: file whose first line is the shared token; every call carries it.
        token_env: environment variable that holds the token (instead of ``token_file``).
        tls_ca: CA certificate (PEM) that verifies the other side; setting it turns TLS on.
        tls_cert: this node's certificate (PEM).
        tls_key: the private key (PEM) of ``tls_cert``.
        mutual_tls: servers require client certificates signed by ``tls_ca``, and clients
            present ``tls_cert``.
        tls_server_name: the name checked against the server's certificate (default: the
            address connected to).

    Example:
        >>> class Options(SecurityOptions):
        ...     endpoint: str
        >>> Options(endpoint="node0:29400").mutual_tls
        False
        >>> from pydantic import ValidationError
        >>> try:
        ...     Options(endpoint="node0:29400", tls_cert="node.pem")
        ... except ValidationError as exc:
        ...     print(exc.errors()[0].get("msg"))
        Value error, tls_cert and tls_key go together
    """

    model_config = ConfigDict(extra="forbid")

    token_file: str | None = None
    token_env: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    mutual_tls: bool = False
    tls_server_name: str | None = None

    @model_validator(mode="after")
    def _token_and_tls(self) -> Self:
        if self.token_file is not None and self.token_env is not None:
            raise ValueError("give token_file or token_env, not both")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        self._check_tls()
        check_files(self)
        return self

    def _check_tls(self) -> None:
        """Refuse TLS settings this wing cannot use (after the pairs are checked, before the files).

        Raises:
            ValueError: what is missing, in the words of the job file.
        """
