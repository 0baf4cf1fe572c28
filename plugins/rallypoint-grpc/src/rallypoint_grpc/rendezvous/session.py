"""The client's side of a session: one long-lived stream to the rendezvous server per backend.

:class:`Session` opens one bidirectional ``Session`` stream and carries every operation of a
:class:`~rallypoint_grpc.rendezvous.backend.GrpcBackend` on it as a tagged message; the server
answers each with a reply carrying the same id, and pushes a watch's event on the same stream when
it fires.

Callers are threads (the backend is synchronous). The streams themselves are ``grpc.aio`` calls
on one event loop per process (:func:`process_loop`, one thread): a caller hands its message to
the loop and waits for its own reply, which the stream's reader task hands over by id. So a
process with many backends (the scale benchmark runs hundreds of nodes per process) holds one
extra thread, not one or two per stream, and a waiting stream costs nothing until its reply comes
(grpcio's synchronous streams wake every waiting reader ten times a second).

Failures keep the shape a unary call's had, so that the backend maps and retries them as before:
an operation the server refuses raises an :class:`OperationRefused` with the gRPC status code
the unary call would have ended with; a stream that breaks (server gone, connection lost) fails every
operation in flight with the stream's own :class:`grpc.RpcError` (``UNAVAILABLE``, ...), and the
session is then spent: the backend opens a new one for its retry. An operation with no reply
within its timeout raises ``DEADLINE_EXCEEDED``. :meth:`Session.close` fails the operations in
flight with :class:`SessionClosed`.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from rallypoint_grpc._proto import rendezvous_pb2 as pb
from rallypoint_grpc.transport import TlsFiles, channel_credentials, channel_options

__all__ = ["METHOD", "OperationRefused", "ProcessLoop", "Session", "SessionClosed", "SessionError", "process_loop"]

log = logging.getLogger(__name__)

#: The service's session method.
METHOD = "/rallypoint.rendezvous.v1.Rendezvous/Session"


class SessionError(grpc.RpcError):  # type: ignore[misc]
    """An operation's failure with the status code its unary call would have had (``code()``, ``details()``)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        """The gRPC status code."""
        return self._code

    def details(self) -> str:
        """The server's (or this client's) message."""
        return self._details


class OperationRefused(SessionError):
    """The server answered the operation with a failure (the stream itself goes on)."""


class SessionClosed(Exception):
    """The session was closed (:meth:`Session.close`) while the operation waited for its reply."""


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _fresh(error: BaseException) -> BaseException:
    """A new exception like ``error`` for one caller (one instance raised in many threads would share a traceback)."""
    if isinstance(error, SessionClosed):
        return SessionClosed(str(error))
    if isinstance(error, OperationRefused):
        return OperationRefused(error.code(), error.details())
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return SessionError(error.code(), error.details() or "")
    return error


class ProcessLoop:
    """The event loop (on its own daemon thread) that runs every session stream of this process.

    It also keeps the process's ``grpc.aio`` channels (one per target, TLS setup and size limit),
    made and used on the loop only.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._channels: dict[tuple[Any, ...], grpc.aio.Channel] = {}
        thread = threading.Thread(target=self._run, name="rallypoint-grpc-sessions", daemon=True)
        thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def channel(self, target: str, tls: TlsFiles | None, max_message_bytes: int) -> grpc.aio.Channel:
        """The loop's channel to ``target`` (call on the loop)."""
        key = (target, tls, max_message_bytes)
        channel = self._channels.get(key)
        if channel is None:
            options = channel_options(max_message_bytes)
            if tls is None:
                channel = grpc.aio.insecure_channel(target, options=options)
            else:
                if tls.server_name:
                    options.append(("grpc.ssl_target_name_override", tls.server_name))
                channel = grpc.aio.secure_channel(target, channel_credentials(tls), options=options)
            self._channels[key] = channel
        return channel


_LOOP: ProcessLoop | None = None
_LOOP_LOCK = threading.Lock()


def process_loop() -> ProcessLoop:
    """The :class:`ProcessLoop` of this process, started on first use (a forked child starts its own)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.pid != os.getpid():
            _LOOP = ProcessLoop()
        return _LOOP


def session_call(target: str, tls: TlsFiles | None, max_message_bytes: int, metadata: tuple[Any, ...]) -> Any:
    """A new ``Session`` stream to ``target`` on the process loop's channel (call on the loop)."""
    channel = process_loop().channel(target, tls, max_message_bytes)
    method = channel.stream_stream(
        METHOD, request_serializer=pb.SessionRequest.SerializeToString, response_deserializer=pb.SessionReply.FromString
    )
    return method(metadata=metadata)


class _Slot:
    """Where the reader leaves one operation's reply (or its failure) for the caller."""

    __slots__ = ("done", "failure", "reply")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: Any = None
        self.failure: BaseException | None = None


class Session:
    """One session stream, opened by ``open_call`` on the process loop; thread-safe.

    Args:
        open_call: makes the stream (a ``grpc.aio`` stream-stream call: ``write``, ``read``,
            ``cancel``); called on the process loop.
    """

    def __init__(self, open_call: Callable[[], Any]) -> None:
        self.pid = os.getpid()
        self._loop = process_loop().loop
        self._lock = threading.Lock()
        self._pending: dict[int, _Slot] = {}
        self._ids = itertools.count(1)
        #: Why the session ended (every later operation fails with it at once); ``None``: open.
        self._ended: BaseException | None = None
        # on the loop only:
        self._call: Any = None
        self._outbox: collections.deque[Any] = collections.deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writing = False
        self._loop.call_soon_threadsafe(self._open, open_call)

    @property
    def ended(self) -> bool:
        """Whether the stream is over (broken or closed): a new session is needed."""
        return self._ended is not None

    # -- on the loop ----------------------------------------------------------------------
    def _task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _open(self, open_call: Callable[[], Any]) -> None:
        if self._ended is not None:
            return
        try:
            self._call = open_call()
        except Exception as exc:  # noqa: BLE001 - every caller gets it
            self._end(SessionError(grpc.StatusCode.UNAVAILABLE, f"cannot open a session: {exc}"))
            return
        self._task(self._read())
        self._flush()

    def _send(self, message: Any) -> None:
        self._outbox.append(message)
        self._flush()

    def _flush(self) -> None:
        if not self._writing and self._call is not None and self._outbox:
            self._writing = True
            self._task(self._write())

    async def _write(self) -> None:
        try:
            while self._outbox:
                await self._call.write(self._outbox.popleft())
        except Exception as exc:  # noqa: BLE001 - the stream is over: its reader reports why
            log.debug("session write failed: %r", exc)
        finally:
            self._writing = False

    async def _read(self) -> None:
        why: BaseException
        try:
            while True:
                reply = await self._call.read()
                if reply is grpc.aio.EOF:
                    why = SessionError(grpc.StatusCode.UNAVAILABLE, "the server ended the session")
                    break
                with self._lock:
                    slot = self._pending.pop(reply.id, None)
                if slot is None:  # its caller gave up waiting (deadline) or cancelled its watch
                    continue
                if reply.WhichOneof("reply") == "failure":
                    code = _CODES.get(reply.failure.code, grpc.StatusCode.UNKNOWN)
                    slot.failure = OperationRefused(code, reply.failure.message)
                else:
                    slot.reply = reply
                slot.done.set()
        except grpc.RpcError as exc:  # the stream broke: its status is every pending operation's error
            why = exc
            if exc.code() == grpc.StatusCode.INTERNAL:
                # grpc.aio ends a call whose message could not be sent (the connection died under
                # the write) with INTERNAL before the transport's own status arrives: a break
                why = SessionError(grpc.StatusCode.UNAVAILABLE, f"the session stream broke ({exc.details()})")
        except asyncio.CancelledError:  # cancelled here (close)
            why = SessionError(grpc.StatusCode.CANCELLED, "the session was cancelled")
        self._end(why)

    def _cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()

    # -- any thread -----------------------------------------------------------------------
    def _end(self, why: BaseException) -> None:
        with self._lock:
            if self._ended is None:
                self._ended = why
            pending, self._pending = self._pending, {}
        for slot in pending.values():
            slot.failure = self._ended
            slot.done.set()

    def call(self, field: str, request: Any, timeout: float) -> Any:
        """Send ``request`` as the operation ``field`` and wait up to ``timeout`` for its reply.

        Returns:
            the operation's reply message (the ``field`` of the session's reply).

        Raises:
            grpc.RpcError: the server refused the operation (a :class:`SessionError` with the
                status code), the stream broke (the stream's error), or no reply came in time
                (``DEADLINE_EXCEEDED``).
            SessionClosed: :meth:`close` was called while the operation waited.
        """
        slot = _Slot()
        with self._lock:
            if self._ended is not None:
                raise _fresh(self._ended)
            request_id = next(self._ids)
            self._pending[request_id] = slot
        message = pb.SessionRequest(id=request_id)
        getattr(message, field).CopyFrom(request)
        self._loop.call_soon_threadsafe(self._send, message)
        if not slot.done.wait(timeout):
            with self._lock:
                given_up = self._pending.pop(request_id, None) is not None
            if given_up:
                if field == "watch":  # the server still holds it: let it go
                    cancel = pb.SessionRequest(id=next(self._ids), cancel=request_id)
                    self._loop.call_soon_threadsafe(self._send, cancel)
                raise SessionError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no reply within {timeout:g} s")
            slot.done.wait()  # the reply (or the failure) is being handed over now
        if slot.failure is not None:
            raise _fresh(slot.failure)
        return getattr(slot.reply, field)

    def close(self) -> None:
        """End the stream; operations in flight raise :class:`SessionClosed`. Closing twice is harmless."""
        self._end(SessionClosed("the rendezvous backend was closed while the call waited for its reply"))
        self._loop.call_soon_threadsafe(self._cancel)
