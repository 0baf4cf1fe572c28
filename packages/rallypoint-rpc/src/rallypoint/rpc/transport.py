"""What an RPC transport provides (the ``rallypoint_rpc_transports`` hook registers them).

A transport moves opaque frames (:mod:`rallypoint.rpc.wire`) between workers and checks the
job's token on every incoming call; it knows nothing of functions, values or RRefs. A record's
``factory`` is called as ``factory(options, token=..., num_threads=...)`` with the validated
``[rpc.options]`` model (or ``None``) and returns an :class:`RpcTransport`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rallypoint.rpc.futures import Future

__all__ = [
    "DeferredHandler",
    "Handler",
    "Reply",
    "RpcTransport",
    "TransportError",
    "TransportRefused",
    "TransportTimeout",
    "TransportUnavailable",
]

#: Runs one incoming request frame (any bytes-like object) and returns the reply frame as its
#: parts (:func:`rallypoint.rpc.wire.pack_parts`: their concatenation is the frame). Called in a
#: transport thread.
Handler = Callable[[Any], list[Any]]
#: A :data:`Handler` that may also answer with a :class:`~rallypoint.rpc.Future` of the reply's
#: parts (a call to an ``async_execution`` function), which never fails. A transport whose class
#: sets ``deferred_replies = True`` is served with one, and sends that reply when the future
#: completes, without holding a thread meanwhile where it can; other transports are served with
#: a plain :data:`Handler`, which holds the thread until the reply is ready.
DeferredHandler = Callable[[Any], "list[Any] | Future[list[Any]]"]
#: Completion of an outgoing call: ``(reply frame, None)`` or ``(None, error)``; the frame is any
#: bytes-like object (a writable one lets tensors use it in place).
Reply = Callable[[Any, BaseException | None], None]


class TransportError(Exception):
    """A call that did not produce a reply, as the transport saw it."""


class TransportTimeout(TransportError):
    """The call's deadline passed."""


class TransportUnavailable(TransportError):
    """The peer cannot be reached (not listening, gone, connection reset)."""


class TransportRefused(TransportError):
    """The peer refused the call before running anything (no or wrong token, oversized message)."""


class RpcTransport(Protocol):
    """One worker's endpoint: a server for its peers and a client to them."""

    def serve(self, handler: Handler, host: str) -> str:
        """Start serving ``handler`` on ``host`` (any free port); return the address peers use."""
        ...

    def call(self, address: str, frame: list[Any], timeout: float | None, reply: Reply) -> None:
        """Send ``frame`` (its parts) to ``address`` without blocking; ``reply`` is called exactly once.

        Errors passed to ``reply`` are :class:`TransportError` subclasses.
        """
        ...

    # Optional: ``call_blocking(address, frame, timeout) -> reply frame``, the same call made in the
    # caller's thread (raising TransportError subclasses); rpc_sync uses it when present.

    def close(self) -> None:
        """Stop serving (after the calls in progress finish) and close the clients."""
        ...
