"""The thin seam between the etcd backend and an etcd v3 client library.

:class:`EtcdClient` is everything :mod:`rallypoint_etcd.backend` asks of etcd: reads with the
revision they saw, puts, compare-and-set and compare-and-delete transactions on a key's
``mod_revision``, leases, and a watch from a given revision. It is built on the ``etcd3`` module
(python-etcd3's API, shipped by the ``etcd3-fc`` distribution); another client library can take
its place by reimplementing this class. Only this module imports ``etcd3`` and ``grpc``, and only
the backend imports this module (the agent and the CLI never load them at start-up).

Errors: :class:`Unavailable` when no endpoint answered (the caller retries), :class:`LeaseGone`
when a lease expired, :class:`EtcdRequestError` for anything else (refused, bad request).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

# gRPC's default poller (epoll1) breaks in a child forked while a watch stream is open (gRPC
# aborts the child); the poll poller survives fork. Its informational notes about forks (every
# worker start is a fork) are not for users. Read when gRPC starts, so set before the import; a
# value set by the user wins.
os.environ.setdefault("GRPC_POLL_STRATEGY", "poll")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import etcd3  # type: ignore[import-untyped]
import etcd3.exceptions  # type: ignore[import-untyped]
import etcd3.utils  # type: ignore[import-untyped]
import grpc

from rallypoint_etcd.options import EtcdOptions, parse_endpoint

__all__ = ["KV", "EtcdClient", "EtcdRequestError", "LeaseGone", "Unavailable"]

T = TypeVar("T")

#: How long a failed endpoint is skipped before it is tried again (seconds).
ENDPOINT_RETRY = 0.25
#: gRPC reconnects quickly after a server restart (its default backoff grows to two minutes).
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10000),
]
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


@dataclass(frozen=True)
class KV:
    """A stored key: its value and the revision of its last write."""

    value: bytes
    mod_revision: int


def _translate(exc: BaseException, where: str) -> Exception:
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


class EtcdClient:
    """One connection (one gRPC channel per endpoint) to an etcd cluster.

    A request goes to the endpoint in use; when it fails for lack of an answer, that endpoint is
    skipped for :data:`ENDPOINT_RETRY` seconds and the next request goes to another one.

    Args:
        options: endpoints, TLS files, credentials and the per-request timeout.
    """

    def __init__(self, options: EtcdOptions) -> None:
        self.options = options
        self.endpoints = list(options.endpoints)
        self._lock = threading.Lock()
        self._client: Any = None

    # -- plumbing --------------------------------------------------------------------------
    def _connect(self) -> Any:
        opts = self.options
        creds = None
        if opts.tls:
            creds = etcd3.MultiEndpointEtcd3Client.get_secure_creds(opts.tls_ca, opts.tls_key, opts.tls_cert)
        eps = []
        for text in self.endpoints:
            host, port, _ = parse_endpoint(text)
            eps.append(
                etcd3.Endpoint(
                    host, port, secure=opts.tls, creds=creds, time_retry=ENDPOINT_RETRY, opts=_CHANNEL_OPTIONS
                )
            )
        client = etcd3.MultiEndpointEtcd3Client(
            endpoints=eps,
            timeout=opts.connect_timeout,
            user=opts.username,
            password=opts.password(),
            failover=True,
        )
        if not opts.tls:
            # gRPC sends call credentials over TLS only; the login token also travels as plain
            # metadata, which is what etcd reads (it is all a plain-text channel can carry).
            client.call_credentials = None
        return client

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(client)``, connecting first; translate the library's errors."""
        try:
            with self._lock:
                if self._client is None:
                    self._client = self._connect()
                client = self._client
            return fn(client)
        except (LeaseGone, Unavailable, EtcdRequestError):
            raise
        except Exception as exc:
            err = _translate(exc, f"{what} on {self.current_endpoint()}")
            if isinstance(err, EtcdRequestError) and "auth token" in str(err):
                self.reset()  # simple tokens die with a server restart: authenticate again
                err = Unavailable(str(err))
            raise err from exc

    def current_endpoint(self) -> str:
        """The endpoint requests go to now (for messages)."""
        client = self._client
        ep = getattr(client, "endpoint_in_use", None) if client is not None else None
        return getattr(ep, "netloc", None) or ",".join(self.endpoints)

    def reset(self) -> None:
        """Drop the connection; the next request connects (and authenticates) again."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                client.close()

    def close(self) -> None:
        """Close the channels."""
        self.reset()

    # -- key-value ---------------------------------------------------------------------------
    def get(self, key: str) -> tuple[KV | None, int]:
        """The key (or ``None``) and the store's revision at the time of the read."""
        resp = self._call("get", lambda c: c.get_response(key))
        kv = resp.kvs[0] if resp.count else None
        return (None if kv is None else KV(kv.value, kv.mod_revision)), resp.header.revision

    def get_prefix(self, prefix: str) -> tuple[dict[str, KV], int]:
        """Every key under ``prefix`` and the store's revision at the time of the read."""
        resp = self._call("range", lambda c: c.get_prefix_response(prefix))
        return {kv.key.decode(): KV(kv.value, kv.mod_revision) for kv in resp.kvs}, resp.header.revision

    def put(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        """Write ``key``; return the revision of the write."""
        resp = self._call("put", lambda c: c.put(key, value, lease=lease))
        return int(resp.header.revision)

    def put_if(self, key: str, value: bytes, *, mod_revision: int | None, lease: int | None) -> tuple[bool, KV | None]:
        """Write ``key`` only if it is at ``mod_revision`` (``None``: absent), in one transaction.

        Returns:
            ``(True, the new KV)`` or ``(False, the current KV or None)``.
        """

        def txn(c: Any) -> tuple[bool, list[Any]]:
            t = c.transactions
            cmp = t.create(key) == 0 if mod_revision is None else t.mod(key) == mod_revision
            ok, responses = c.transaction(
                compare=[cmp], success=[t.put(key, value, lease=lease), t.get(key)], failure=[t.get(key)]
            )
            return bool(ok), responses

        ok, responses = self._call("transaction", txn)
        found = responses[-1]
        current = KV(found[0][0], found[0][1].mod_revision) if found else None
        return ok, current

    def delete(self, key: str, *, mod_revision: int | None = None) -> bool:
        """Delete ``key`` (only at ``mod_revision`` when given); whether something was deleted."""
        if mod_revision is None:
            return bool(self._call("delete", lambda c: c.delete(key)))

        def txn(c: Any) -> bool:
            t = c.transactions
            ok, _ = c.transaction(compare=[t.mod(key) == mod_revision], success=[t.delete(key)], failure=[])
            return bool(ok)

        return self._call("transaction", txn)

    # -- leases ------------------------------------------------------------------------------
    def grant(self, ttl: int, lease: int | None = None) -> int:
        """A new lease of ``ttl`` seconds (etcd may round it up); its id.

        With ``lease``, the lease gets that id; a lease of that id that exists already is kept
        (and its id returned), so clients that race to create the same lease all succeed.
        """

        def call(c: Any) -> int:
            try:
                return int(c.lease(ttl, lease_id=lease).id)
            except etcd3.exceptions.PreconditionFailedError:
                if lease is None:
                    raise
                return lease  # "lease already exists"

        return self._call("lease grant", call)

    def keep_alive(self, lease: int) -> int:
        """Refresh a lease; its remaining TTL in seconds (0 when it no longer exists)."""
        responses = self._call("lease keep-alive", lambda c: list(c.refresh_lease(lease)))
        return int(responses[-1].TTL) if responses else 0

    def revoke(self, lease: int) -> None:
        """Revoke a lease: every key attached to it is deleted."""
        self._call("lease revoke", lambda c: c.revoke_lease(lease))

    # -- watches -----------------------------------------------------------------------------
    def wait(self, key: str, *, prefix: bool, start_revision: int, timeout: float) -> bool:
        """Block until an event on ``key`` (or under it, with ``prefix``) at or after ``start_revision``.

        Returns:
            ``True`` on an event, ``False`` when ``timeout`` passed.

        Raises:
            Unavailable: the watch stream broke (the caller reads again and watches again).
        """
        fired = threading.Event()
        broken: list[BaseException] = []

        def callback(response: Any) -> None:
            if isinstance(response, BaseException):
                broken.append(response)
                fired.set()
            elif response.events:
                fired.set()

        extra: dict[str, Any] = {}
        if prefix:
            extra["range_end"] = etcd3.utils.prefix_range_end(etcd3.utils.to_bytes(key))
        watch_id = self._call(
            "watch", lambda c: c.add_watch_callback(key, callback, start_revision=start_revision, **extra)
        )
        try:
            changed = fired.wait(timeout)
        finally:
            with contextlib.suppress(Exception):  # the stream may be gone already
                self._call("cancel watch", lambda c: c.cancel_watch(watch_id))
        if broken:
            raise _translate(broken[0], f"watch on {self.current_endpoint()}")
        return changed
