"""gRPC plumbing shared by the rendezvous service and the RPC transport: endpoints, TLS, token, channels.

Everything a gRPC client or server of rallypoint needs, with nothing rendezvous-specific:

* :func:`parse_endpoint` / :func:`format_endpoint`: ``HOST:PORT`` (``[v6]:PORT`` too), from
  :mod:`rallypoint_grpc.endpoints` (which imports no grpc).
* :class:`TlsFiles` and :func:`server_credentials` / :func:`channel_credentials`: TLS and mutual
  TLS from PEM files, read when the credentials are built (errors name the file).
* :func:`read_token`: the shared token from a file or an environment variable;
  :func:`token_metadata` sends it, :class:`TokenInterceptor` (``grpc.aio`` servers) refuses every
  call without it with ``UNAUTHENTICATED`` before any handler runs.
* :func:`get_channel`: one channel per process and target (a forked child opens its own), with
  message-size limits, keepalive and fast reconnection; :class:`Backoff` for callers' retries.

This module imports grpc: import it only where gRPC is used (never from the agent or the CLI at
start-up).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from rallypoint_grpc.endpoints import format_endpoint, parse_endpoint

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "TOKEN_HEADER",
    "Backoff",
    "TlsFiles",
    "TokenInterceptor",
    "channel_credentials",
    "channel_options",
    "format_endpoint",
    "get_channel",
    "parse_endpoint",
    "read_token",
    "server_credentials",
    "server_options",
    "token_metadata",
]

#: Largest message either side accepts by default (requests and replies).
DEFAULT_MAX_MESSAGE_BYTES = 4 << 20
#: Metadata key of the shared token (``authorization: Bearer <token>``).
TOKEN_HEADER = "authorization"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a TLS setup.

    Server side: ``cert``/``key`` are the server's certificate chain and key (required); ``ca``,
    when given, is the CA that client certificates must chain to (mutual TLS).
    Client side: ``ca`` verifies the server (``None``: the system's roots); ``cert``/``key`` are
    the client's certificate for mutual TLS; ``server_name`` overrides the name checked against the
    server's certificate (when the endpoint is an IP address or another name).
    """

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    server_name: str | None = None


def _read_pem(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN" not in data:
        raise ValueError(f"the {what} {path} is not a PEM file (no '-----BEGIN' line)")
    return data


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """Server credentials from PEM files; with ``tls.ca``, client certificates are required."""
    if tls.cert is None or tls.key is None:
        raise ValueError("TLS on a server needs both a certificate (--tls-cert) and its key (--tls-key)")
    cert = _read_pem(tls.cert, "TLS certificate")
    key = _read_pem(tls.key, "TLS key")
    ca = _read_pem(tls.ca, "client CA certificate")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """Client credentials from PEM files (``cert`` and ``key`` go together)."""
    if (tls.cert is None) != (tls.key is None):
        raise ValueError("a client certificate needs its key and the key its certificate (tls_cert and tls_key)")
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(tls.ca, "CA certificate"),
        private_key=_read_pem(tls.key, "TLS key"),
        certificate_chain=_read_pem(tls.cert, "TLS certificate"),
    )


def read_token(token_file: str | None = None, token_env: str | None = None) -> str | None:
    """The shared token: the first line of ``token_file``, or the variable ``token_env``.

    Returns ``None`` when neither is given. Raises ``ValueError`` naming the file or variable
    when it is missing or empty.
    """
    if token_file is not None:
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read the token file {token_file}: {exc.strerror or exc}") from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise ValueError(f"the token file {token_file} is empty")
        return token
    if token_env is not None:
        token = os.environ.get(token_env, "").strip()
        if not token:
            raise ValueError(f"the token variable {token_env} is not set (or empty) in this environment")
        return token
    return None


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata that carries ``token`` (empty without a token)."""
    return () if token is None else ((TOKEN_HEADER, f"Bearer {token}"),)


def token_matches(metadata: Sequence[Any] | None, token: str) -> bool:
    """Whether call metadata carries ``token`` (constant-time comparison)."""
    expected = f"Bearer {token}".encode()
    for item in metadata or ():
        key, value = item[0], item[1]
        if key == TOKEN_HEADER:
            got = value.encode() if isinstance(value, str) else bytes(value)
            return hmac.compare_digest(got, expected)
    return False


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every call that does not carry the token, with ``UNAUTHENTICATED``.

    The refusal happens before the request is even parsed: no handler of the service runs.
    """

    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Pass authenticated calls on; answer the others with a handler that aborts."""
        handler = await continuation(details)
        if handler is None or token_matches(details.invocation_metadata, self._token):
            return handler

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token: this server requires one")

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(deny)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(deny)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(deny)
        return grpc.stream_stream_rpc_method_handler(deny)


#: Calls that have arrived but that the server's event loop has not taken up yet. grpc core's
#: defaults (1000 soft, 3000 hard) cancel calls beyond them: when thousands of agents call at
#: once (a round's joins, their watches), some were answered ``CANCELLED`` (#38).
MAX_PENDING_CALLS = 65_536


def server_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """Server options: limits, no SO_REUSEPORT, keepalive pings accepted, idle connections closed.

    Room is left for :data:`MAX_PENDING_CALLS` calls arriving at once. Without SO_REUSEPORT a
    second server on the same port fails to bind instead of sharing it.
    """
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.max_connection_idle_ms", 5 * 60_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_concurrent_streams", 1_000_000),
        ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
    ]


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """Client options: message limits, keepalive, reconnection backoff capped at 1 s.

    gRPC's own retries are off: callers retry with their own deadlines.
    """
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 1_000),
        ("grpc.enable_retries", 0),
    ]


_CHANNELS: dict[tuple[Any, ...], grpc.Channel] = {}
_CHANNELS_LOCK = threading.Lock()


def _start_connecting(channel: grpc.Channel) -> None:
    """Ask the channel to connect now, without a thread and without waiting.

    ``grpc.channel_ready_future`` would do it with a polling thread, and a thread inside gRPC
    while the process forks breaks gRPC in the child. The cython channel's
    ``check_connectivity_state(True)`` starts the connection from the calling thread; where this
    grpcio lacks it, the first call connects instead.
    """
    inner = getattr(channel, "_channel", None)
    with contextlib.suppress(Exception):
        inner.check_connectivity_state(True)  # type: ignore[union-attr]


def get_channel(
    target: str, tls: TlsFiles | None = None, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> grpc.Channel:
    """The process's channel to ``target`` (one per process, target, TLS setup and size limit).

    The cache is keyed by process id too: a forked child never reuses its parent's channel.
    A new channel starts connecting at once, in the background.
    """
    key = (os.getpid(), target, tls, max_message_bytes)
    with _CHANNELS_LOCK:
        channel = _CHANNELS.get(key)
        if channel is None:
            options = channel_options(max_message_bytes)
            if tls is None:
                channel = grpc.insecure_channel(target, options=options)
            else:
                if tls.server_name:
                    options.append(("grpc.ssl_target_name_override", tls.server_name))
                channel = grpc.secure_channel(target, channel_credentials(tls), options=options)
            _CHANNELS[key] = channel
            # Start connecting now (without waiting): the first call does not pay the handshake.
            _start_connecting(channel)
        return channel


class Backoff:
    """Exponential backoff with jitter within a deadline: ``while b.wait(): retry``.

    Args:
        window: seconds from now after which :meth:`wait` returns ``False``.
        first: the first pause; each pause doubles up to ``cap``.
    """

    def __init__(self, window: float, *, first: float = 0.02, cap: float = 1.0) -> None:
        self.deadline = time.monotonic() + window
        self._pause = first
        self._cap = cap

    def remaining(self) -> float:
        """Seconds left of the window (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def wait(self) -> bool:
        """Sleep the next pause (cut at the deadline); ``False`` when the window is spent."""
        left = self.remaining()
        if left <= 0:
            return False
        time.sleep(min(left, self._pause * random.uniform(0.5, 1.0)))
        self._pause = min(self._pause * 2, self._cap)
        return True
