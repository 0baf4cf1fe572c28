"""The connection to an etcd cluster: one gRPC channel per endpoint, failover, re-login.

:class:`EtcdConnection` connects on the first request, sends every request through one door
(:meth:`EtcdConnection._call`, which translates the library's errors, see
:mod:`rallypoint_etcd.client.errors`), and skips an endpoint that did not answer for
:data:`ENDPOINT_RETRY` seconds. The request classes (:mod:`~rallypoint_etcd.client.kv`,
:mod:`~rallypoint_etcd.client.lease`, :mod:`~rallypoint_etcd.client.watch`) build on it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import etcd3  # type: ignore[import-untyped]
import grpc
import grpc.experimental

from rallypoint_etcd.client.errors import EtcdRequestError, LeaseGone, Unavailable, translate
from rallypoint_etcd.options import EtcdOptions, parse_endpoint

__all__ = ["ENDPOINT_RETRY", "EtcdConnection"]

T = TypeVar("T")

#: How long a failed endpoint is skipped before it is tried again (seconds).
ENDPOINT_RETRY = 0.25
#: gRPC reconnects quickly after a server restart (its default backoff grows to two minutes).
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10000),
    # A unary-stream call (our watch: one request, then answers) is read by the calling thread
    # alone; without it gRPC runs a thread per channel to poll such calls.
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
]


class EtcdConnection:
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
            err = translate(exc, f"{what} on {self.current_endpoint()}")
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
