"""Options that name a file or an environment variable a plugin reads at start-up.

A plugin's options model checks them when the job is validated (``rallypoint config check`` and
``rallypoint run`` before anything starts), so that a missing certificate or an unset password
variable is a located configuration error rather than a failure after start-up:

.. code-block:: python

    @model_validator(mode="after")
    def _files(self) -> MyOptions:
        problem = file_problem(self.tls_ca, "CA certificate", pem=True) if self.tls_ca else None
        if problem:
            raise cross_field_error("file", problem + "; give every node the file", ("tls_ca",))
        return self
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

__all__ = ["MAX_OPTION_FILE_BYTES", "file_problem", "variable_problem"]

#: The largest file an option may name (certificates, keys, tokens are a few KiB).
MAX_OPTION_FILE_BYTES = 1 << 20


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is, in words (``None`` for a regular file)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None if stat.S_ISREG(mode) else "not a regular file"


def file_problem(path: str, what: str, *, pem: bool = False, max_bytes: int = MAX_OPTION_FILE_BYTES) -> str | None:
    """Why the file at ``path`` cannot serve as ``what``, or ``None`` when it can.

    The file must be a regular file (not a directory, a named pipe, a device or a socket,
    which a read would block on or never finish), readable by this user, not empty, at most
    ``max_bytes`` long and, with ``pem``, hold a PEM block (a ``-----BEGIN`` line).

    Args:
        path: the path as the user wrote it.
        what: what the file is, for the message (``"CA certificate"``).
        pem: the file must be PEM text.
        max_bytes: the largest size accepted.

    Example:
        >>> file_problem("/nonexistent/ca.pem", "CA certificate", pem=True)
        'cannot read the CA certificate /nonexistent/ca.pem: No such file or directory'
        >>> file_problem("/", "token file")
        'the token file / is a directory, not a file'
    """
    try:
        kind = _kind(os.stat(path).st_mode)
        if kind is not None:
            return f"the {what} {path} is {kind}, not a file"
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        return f"cannot read the {what} {path}: {exc.strerror or exc}"
    if len(data) > max_bytes:
        return f"the {what} {path} is larger than {max_bytes // 1024} KiB; is it the right file?"
    if not data.strip():
        return f"the {what} {path} is empty"
    if pem and b"-----BEGIN" not in data:
        return f"the {what} {path} is not a PEM file (no '-----BEGIN' line)"
    return None


def variable_problem(
    name: str, what: str, *, allow_empty: bool = False, environ: Mapping[str, str] | None = None
) -> str | None:
    """Why the environment variable ``name`` cannot provide ``what``, or ``None`` when it can.

    Args:
        name: the variable's name.
        what: what it holds, for the message (``"etcd password"``).
        allow_empty: an empty (or blank) value is accepted.
        environ: where to look (default :data:`os.environ`).

    Example:
        >>> variable_problem("RP_EXAMPLE", "token", environ={})
        'the variable RP_EXAMPLE (token) is not set in this environment'
    """
    env = os.environ if environ is None else environ
    value = env.get(name)
    if value is None:
        return f"the variable {name} ({what}) is not set in this environment"
    if not allow_empty and not value.strip():
        return f"the variable {name} ({what}) is empty"
    return None
