"""The server's side of a session: one client's long-lived stream, its operations and its watches.

A client (:mod:`rallypoint_grpc.rendezvous.session`) sends every operation of its backend as a
tagged ``SessionRequest`` on one bidirectional stream. :class:`ServerSession` reads them in order on
the server's event loop and answers each with a ``SessionReply`` carrying the same id: an operation
of the store at once (the store is touched only from the loop, so each stays atomic), a watch when
it fires or times out, from its own small task. No call is set up per operation: no metadata, no
interceptor, no status; the token is checked once, when the stream opens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import grpc
import grpc.aio

from rallypoint_grpc._proto import rendezvous_pb2 as pb
from rallypoint_grpc.rendezvous.limits import StoreError

__all__ = ["CODES", "ServerSession", "SessionService"]

log = logging.getLogger(__name__)

#: The gRPC status of each :class:`~rallypoint_grpc.rendezvous.limits.StoreError` code, for a unary
#: call's abort and a session's ``Failure`` alike (the client maps both the same way).
CODES = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class SessionService(Protocol):
    """What a session needs of the service: its operations, its watch and its call counter."""

    calls: int
    operations: dict[str, Callable[[Any], Any]]

    def wait(self, request: Any) -> Coroutine[Any, Any, Any]:
        """A watch's one event (see :meth:`rallypoint_grpc.rendezvous.server.RendezvousService.wait`)."""
        ...


def _failure(request_id: int, code: grpc.StatusCode, message: str) -> Any:
    return pb.SessionReply(id=request_id, failure=pb.Failure(code=code.value[0], message=message))


class ServerSession:
    """Serves one session stream: operations in order, watches concurrently, replies one at a time."""

    def __init__(self, service: SessionService, context: grpc.aio.ServicerContext) -> None:
        self._service = service
        self._context = context
        self._watches: dict[int, asyncio.Task[None]] = {}
        self._writing = asyncio.Lock()  # one message written at a time on a stream

    async def serve(self) -> None:
        """Read and answer operations until the client ends the stream (its watches then end too)."""
        try:
            while True:
                message = await self._context.read()
                if message is grpc.aio.EOF:
                    return
                await self._handle(message)
        finally:
            for task in self._watches.values():
                task.cancel()
            self._watches.clear()

    async def _handle(self, message: Any) -> None:
        kind = message.WhichOneof("op")
        if kind == "cancel":
            task = self._watches.pop(message.cancel, None)
            if task is not None:
                task.cancel()
            return
        self._service.calls += 1
        if kind == "watch":
            self._watches[message.id] = asyncio.ensure_future(self._watch(message.id, message.watch))
            return
        op = self._service.operations.get(kind) if kind is not None else None
        if op is None:  # a newer client's operation: the client falls back as for a missing unary call
            reply = _failure(message.id, grpc.StatusCode.UNIMPLEMENTED, f"no operation {kind!r} on this server")
        else:
            try:
                reply = pb.SessionReply(id=message.id, **{kind: op(getattr(message, kind))})
            except StoreError as exc:
                reply = _failure(message.id, CODES[exc.code], str(exc))
        await self._send(reply)

    async def _watch(self, request_id: int, request: Any) -> None:
        try:
            try:
                reply = pb.SessionReply(id=request_id, watch=await self._service.wait(request))
            except StoreError as exc:
                reply = _failure(request_id, CODES[exc.code], str(exc))
            await self._send(reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the stream is gone: its reader ends the session
            log.debug("session watch %d not answered: %s", request_id, exc)
        finally:
            self._watches.pop(request_id, None)

    async def _send(self, reply: Any) -> None:
        async with self._writing:
            await self._context.write(reply)
