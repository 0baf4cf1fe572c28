"""The errors of an etcd request, and the translation of the client library's errors into them.

:class:`Unavailable` when no endpoint answered (the caller retries), :class:`LeaseGone` when a
lease expired, :class:`EtcdRequestError` for anything else (refused, bad request).
"""

from __future__ import annotations

import etcd3.exceptions  # type: ignore[import-untyped]
import grpc

__all__ = ["EtcdRequestError", "LeaseGone", "Unavailable", "deadline_passed", "translate"]

_UNAVAILABLE = (
    etcd3.exceptions.ConnectionFailedError,
    etcd3.exceptions.ConnectionTimeoutError,
    etcd3.exceptions.NoServerAvailableError,
    etcd3.exceptions.InternalServerError,
    etcd3.exceptions.WatchTimedOut,
)
_RETRY_CODES = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "CANCELLED", "UNKNOWN"}


class Unavailable(Exception):
    """No endpoint answered (down, restarting, electing a leader); the request may be retried."""


class LeaseGone(Exception):
    """The lease named in a request no longer exists (it expired or was revoked)."""


class EtcdRequestError(Exception):
    """etcd refused the request (permission denied, bad credentials, invalid request)."""


def deadline_passed(exc: grpc.RpcError) -> bool:
    """Whether a call ended at its deadline.

    The status is the client's own, or etcd's: its server sees the same deadline and may end the
    stream first, with UNKNOWN "context deadline exceeded".
    """
    code = exc.code() if hasattr(exc, "code") else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    details = exc.details() if hasattr(exc, "details") else ""
    return code == grpc.StatusCode.UNKNOWN and "deadline exceeded" in str(details)


def translate(exc: BaseException, where: str) -> Exception:
    """The error to raise for ``exc``, a failure of the request described by ``where``."""
    if isinstance(exc, etcd3.exceptions.RevisionCompactedError):
        return Unavailable(f"{where}: watch revision was compacted")
    if isinstance(exc, _UNAVAILABLE):
        return Unavailable(f"{where}: {type(exc).__name__}: {exc}")
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        name = getattr(code, "name", str(code))
        if "lease not found" in str(details):
            return LeaseGone(str(details))
        if name in _RETRY_CODES or "leader" in str(details) or "timed out" in str(details):
            return Unavailable(f"{where}: {name}: {details}")
        return EtcdRequestError(f"{where}: {name}: {details}")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))
