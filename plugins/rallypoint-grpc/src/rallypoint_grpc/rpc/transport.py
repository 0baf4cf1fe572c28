"""The ``grpc`` RPC transport: frames of :mod:`rallypoint.rpc.wire` over gRPC and persistent sockets.

Each worker runs a gRPC server whose thread pool runs the requests (no event loop in between),
and calls its peers through the process's cached channels
(:func:`rallypoint_grpc.transport.get_channel`): ``rpc_sync`` in the caller's own thread. Every
call carries the job's token; the server checks it (``token_matches``, the rendezvous service's
check) before the request is read and refuses calls without it with ``UNAUTHENTICATED``.
Frames are bytes end to end (no protobuf): tensors travel as raw buffers.

With ``sockets`` (the default), the first call to a peer is a gRPC ``Hello`` (token checked)
that returns where the peer also listens (:mod:`rallypoint_grpc.rpc.socket_server`); later calls travel
over one persistent socket per pair of workers, a Unix socket on one host, and carry the token
each. A peer whose sockets cannot be reached keeps being called over gRPC.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from rallypoint.rpc.transport import (
    DeferredHandler,
    Reply,
    TransportError,
    TransportRefused,
    TransportTimeout,
    TransportUnavailable,
)
from rallypoint.rpc.wire import frame_size
from rallypoint_grpc.rpc.options import GrpcRpcOptions
from rallypoint_grpc.rpc.shared_memory import METADATA_KEY, REF_MAGIC, THRESHOLD, SharedMemoryPath
from rallypoint_grpc.rpc.socket_client import ClientConnection, Deadlines, NotSent, connect
from rallypoint_grpc.rpc.socket_server import SocketServer
from rallypoint_grpc.transport import (
    TOKEN_HEADER,
    TlsFiles,
    format_endpoint,
    get_channel,
    parse_endpoint,
    read_token,
    server_credentials,
    server_options,
    token_matches,
    token_metadata,
)

__all__ = ["HELLO_METHOD", "METHOD", "STREAM_METHOD", "GrpcRpcTransport", "create_grpc_rpc_transport"]

#: The one gRPC method RPC frames travel on.
METHOD = "/rallypoint.rpc.Rpc/Call"
#: The streaming method large frames travel on, in chunks (requests and replies).
STREAM_METHOD = "/rallypoint.rpc.Rpc/CallStream"
#: The method that tells a caller where the worker's sockets listen (JSON).
HELLO_METHOD = "/rallypoint.rpc.Rpc/Hello"
_REFUSED = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INVALID_ARGUMENT,
}


def create_grpc_rpc_transport(options: GrpcRpcOptions | None, *, token: str, num_threads: int) -> GrpcRpcTransport:
    """The factory the ``grpc`` transport record names."""
    opts = options or GrpcRpcOptions()
    configured = read_token(opts.token_file, opts.token_env)
    return GrpcRpcTransport(opts, token=configured or token, num_threads=num_threads)


class GrpcRpcTransport:
    """One worker's gRPC server and client (see the module docstring)."""

    def __init__(self, options: GrpcRpcOptions, *, token: str, num_threads: int = 16) -> None:
        self.options = options
        self.token = token
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="rpc-serve")
        self._server: Any = None
        self._client_tls = self._tls_for_clients()
        self.shm = SharedMemoryPath.create(options.max_message_bytes) if options.same_host_shm else None
        marker = ((METADATA_KEY, self.shm.marker),) if self.shm is not None else ()
        self._metadata = token_metadata(token) + marker
        self._local: set[str] = set()
        self._stubs: dict[int, tuple[grpc.Channel, Any]] = {}
        self._sockets: SocketServer | None = None
        self._connections: dict[str, ClientConnection | None] = {}
        self._connect_lock = threading.Lock()
        self._deadlines = Deadlines()
        #: Frames larger than this travel in chunks of this size (when not through shared memory).
        self.chunk_bytes = min(options.chunk_bytes, options.max_message_bytes)
        self._streams = ThreadPoolExecutor(4, thread_name_prefix="rpc-stream")

    def _tls_for_clients(self) -> TlsFiles | None:
        o = self.options
        if o.tls_ca is None:
            return None
        mutual = o.mutual_tls
        return TlsFiles(
            cert=o.tls_cert if mutual else None,
            key=o.tls_key if mutual else None,
            ca=o.tls_ca,
            server_name=o.tls_server_name,
        )

    # ------------------------------------------------------------- server
    #: Replies to async_execution calls over the sockets are sent when they are ready, the
    #: serving thread free meanwhile; a gRPC call's thread waits for its reply (a synchronous server).
    deferred_replies = True

    def serve(self, handler: DeferredHandler, host: str) -> str:
        """Start the server on ``host`` (a free port); returns ``HOST:PORT``."""

        def blocking(frame: Any) -> list[Any]:
            answer = handler(frame)
            return answer if isinstance(answer, list) else answer.wait()

        def call(request: bytes, context: grpc.ServicerContext) -> bytes:
            shm = self.shm
            if shm is None:
                return b"".join(blocking(request))
            context.send_initial_metadata(((METADATA_KEY, shm.marker),))
            frame: Any = request
            if request[: len(REF_MAGIC)] == REF_MAGIC:
                try:
                    frame = shm.take(request)
                except ValueError as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            parts = blocking(frame)
            if frame_size(parts) >= THRESHOLD and shm.visible(_marker(context.invocation_metadata())):
                return shm.put(parts)[0]
            return b"".join(parts)

        def call_stream(chunks: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            frame = self._gather(chunks, context.abort)
            if self.shm is not None:
                context.send_initial_metadata(((METADATA_KEY, self.shm.marker),))
            yield from _chunks(blocking(frame), self.chunk_bytes)

        self._sockets = self._serve_sockets(handler, host) if self.options.sockets else None
        hello = json.dumps(self._where()).encode()
        methods = {
            "Call": grpc.unary_unary_rpc_method_handler(call),
            "CallStream": grpc.stream_stream_rpc_method_handler(call_stream),
            "Hello": grpc.unary_unary_rpc_method_handler(lambda request, context: hello),
        }
        server = grpc.server(
            self._pool,
            handlers=[grpc.method_handlers_generic_handler("rallypoint.rpc.Rpc", methods)],
            interceptors=[_TokenCheck(self.token)],
            options=server_options(self.options.max_message_bytes),
        )
        target = format_endpoint(host, 0)
        o = self.options
        if o.tls_cert is not None:
            tls = TlsFiles(cert=o.tls_cert, key=o.tls_key, ca=o.tls_ca if o.mutual_tls else None)
            port = server.add_secure_port(target, server_credentials(tls))
        else:
            port = server.add_insecure_port(target)
        server.start()
        self._server = server
        return format_endpoint(host, port)

    # ------------------------------------------------------------- client
    def call(self, address: str, frame: list[Any], timeout: float | None, reply: Reply) -> None:
        """Send ``frame`` to ``address``; ``reply`` gets the answer or a transport error."""
        try:
            conn = self._connection(address, timeout)
        except TransportError as exc:
            reply(None, exc)
            return
        if conn is not None:
            try:
                conn.call(frame, timeout, reply)
            except NotSent:  # the peer closed the connection before: once more, on a new one
                self._call_again(address, frame, timeout, reply)
            return
        self._call_grpc(address, frame, timeout, reply)

    def _call_grpc(self, address: str, frame: list[Any], timeout: float | None, reply: Reply) -> None:
        """:meth:`call` as a gRPC call (a peer without sockets, or with sockets off)."""
        channel = get_channel(address, self._client_tls, max_message_bytes=self.options.max_message_bytes)
        if self._streamed(address, frame):
            self._streams.submit(self._stream_reply, channel, address, frame, timeout, reply)
            return
        request, sent = self._outgoing(address, frame)
        try:
            future = self._unary(channel).future(request, timeout=timeout, metadata=self._metadata)
        except Exception as exc:  # noqa: BLE001 - e.g. a closed channel
            self._forget(sent)
            reply(None, TransportUnavailable(str(exc)))
            return

        def done(fut: Any) -> None:
            try:
                reply(self._incoming(address, fut.result(), fut, sent), None)
            except grpc.RpcError as exc:
                self._forget(sent)
                reply(None, _error(exc))
            except Exception as exc:  # noqa: BLE001 - cancelled futures, a bad shared-memory reply
                self._forget(sent)
                reply(None, TransportUnavailable(f"{type(exc).__name__}: {exc}"))

        future.add_done_callback(done)

    def call_blocking(self, address: str, frame: list[Any], timeout: float | None) -> Any:
        """The same call, made in the caller's thread; raises a transport error."""
        conn = self._connection(address, timeout)
        if conn is not None:
            try:
                return conn.call_blocking(frame, timeout)
            except NotSent:  # the peer closed the connection before: once more, on a new one
                conn = self._connection(address, timeout)
                if conn is not None:
                    return conn.call_blocking(frame, timeout)
                # the peer offers no socket any more: over gRPC
        channel = get_channel(address, self._client_tls, max_message_bytes=self.options.max_message_bytes)
        if self._streamed(address, frame):
            return self._stream(channel, address, frame, timeout)
        request, sent = self._outgoing(address, frame)
        try:
            answer, call = self._unary(channel).with_call(request, timeout=timeout, metadata=self._metadata)
            return self._incoming(address, answer, call, sent)
        except grpc.RpcError as exc:
            raise _error(exc) from None
        except ValueError as exc:  # a closed channel, a bad shared-memory reply
            raise TransportUnavailable(str(exc)) from None
        finally:
            self._forget(sent)

    def _call_again(self, address: str, frame: list[Any], timeout: float | None, reply: Reply) -> None:
        """The second and last try of an asynchronous call whose request could not leave."""
        try:
            conn = self._connection(address, timeout)
            if conn is None:  # the peer offers no socket any more: over gRPC
                self._call_grpc(address, frame, timeout, reply)
                return
            conn.call(frame, timeout, reply)
        except TransportError as exc:
            reply(None, exc)

    def _unary(self, channel: grpc.Channel) -> Any:
        """The channel's callable for :data:`METHOD`, made once per channel."""
        stub = self._stubs.get(id(channel))
        if stub is None or stub[0] is not channel:
            stub = self._stubs[id(channel)] = (channel, channel.unary_unary(METHOD))
        return stub[1]

    # ------------------------------------------------------------ sockets
    @property
    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata of every gRPC call: the token (and the shared-memory marker)."""
        return self._call_metadata

    @_metadata.setter
    def _metadata(self, value: tuple[tuple[str, str], ...]) -> None:
        # the socket path sends the same token as the gRPC calls
        self._call_metadata = value
        self._token_bytes = next((str(v).encode() for k, v in value if k == TOKEN_HEADER), b"")

    def _serve_sockets(self, handler: DeferredHandler, host: str) -> SocketServer:
        sockets = SocketServer(handler, self.token, self.options.max_frame_bytes)
        if self.options.tls_cert is None:  # with TLS, calls between hosts stay on gRPC
            sockets.listen_tcp(host)
        if self.shm is not None:
            sockets.listen_unix()
        return sockets

    def _where(self) -> dict[str, Any]:
        """What ``Hello`` answers: this worker's socket port and path, and its same-host marker."""
        sockets = self._sockets
        return {
            "tcp": sockets.tcp_port if sockets is not None else None,
            "unix": sockets.unix_path if sockets is not None else None,
            "marker": self.shm.marker if self.shm is not None else None,
        }

    def _connection(self, address: str, timeout: float | None) -> ClientConnection | None:
        """The socket to ``address`` (made on first use, again after it broke), or ``None``: use gRPC."""
        conn = self._connections.get(address)
        if conn is not None and conn.broken is None:
            return conn
        if not self.options.sockets or (conn is None and address in self._connections):
            return None
        with self._connect_lock:
            conn = self._connections.get(address)
            if address not in self._connections or (conn is not None and conn.broken is not None):
                conn = self._connections[address] = self._open(address, timeout)
        return conn

    def _open(self, address: str, timeout: float | None) -> ClientConnection | None:
        """Ask ``address`` where its sockets are (gRPC, token checked) and connect to the best one."""
        channel = get_channel(address, self._client_tls, max_message_bytes=self.options.max_message_bytes)
        try:
            answer = channel.unary_unary(HELLO_METHOD)(b"", timeout=timeout or 30.0, metadata=self._metadata)
            where = json.loads(answer)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None  # a peer without sockets
            raise _error(exc) from None
        except ValueError:
            return None
        local = self.shm is not None and self.shm.visible(where.get("marker"))
        if local:
            self._local.add(address)
        choices: list[tuple[str, Any]] = []
        if local and isinstance(where.get("unix"), str):
            choices.append(("unix", where["unix"]))
        if self._client_tls is None and isinstance(where.get("tcp"), int):
            choices.append(("tcp", (parse_endpoint(address)[0], where["tcp"])))
        for kind, target in choices:
            try:
                sock = connect(kind, target, min(timeout or 10.0, 10.0))
            except OSError:
                continue
            return ClientConnection(
                sock, address, lambda: self._token_bytes, self._deadlines, self.options.max_frame_bytes
            )
        return None

    # ------------------------------------------------------- large frames
    def _streamed(self, address: str, frame: list[Any]) -> bool:
        """Whether ``frame`` goes in chunks: larger than a chunk, and not to a peer of this host."""
        size = frame_size(frame)
        return size > self.chunk_bytes and not (self.shm is not None and address in self._local)

    def _gather(self, chunks: Iterator[bytes], abort: Callable[[grpc.StatusCode, str], Any]) -> bytearray:
        """The frame that ``chunks`` make up (writable: tensors decoded from it use it in place)."""
        frame = bytearray()
        for chunk in chunks:
            if len(frame) + len(chunk) > self.options.max_frame_bytes:
                abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"frame larger than max_frame_bytes ({self.options.max_frame_bytes} bytes)",
                )
            frame += chunk
        return frame

    def _stream(self, channel: grpc.Channel, address: str, frame: list[Any], timeout: float | None) -> bytearray:
        """A large frame in chunks over the streaming method; the reply comes back the same way."""
        try:
            replies = channel.stream_stream(STREAM_METHOD)(
                _chunks(frame, self.chunk_bytes), timeout=timeout, metadata=self._metadata
            )
            answer = self._gather(replies, _abort_locally)
            self._learn(address, replies)
            return answer
        except grpc.RpcError as exc:
            raise _error(exc) from None
        except ValueError as exc:  # a closed channel, a reply over max_frame_bytes
            raise TransportUnavailable(str(exc)) from None

    def _stream_reply(
        self, channel: grpc.Channel, address: str, frame: list[Any], timeout: float | None, reply: Reply
    ) -> None:
        try:
            answer = self._stream(channel, address, frame, timeout)
        except TransportError as exc:
            reply(None, exc)
            return
        reply(answer, None)

    def _learn(self, address: str, call: Any) -> None:
        """Note from a reply's metadata whether ``address`` shares this host."""
        if self.shm is not None and address not in self._local:
            with contextlib.suppress(Exception):
                if self.shm.visible(_marker(call.initial_metadata())):
                    self._local.add(address)

    def _outgoing(self, address: str, frame: list[Any]) -> tuple[bytes, str | None]:
        """The message for ``frame``: a shared-memory reference to a peer of this host, else the frame."""
        if self.shm is not None and address in self._local and frame_size(frame) >= THRESHOLD:
            return self.shm.put(frame)
        return b"".join(frame), None

    def _incoming(self, address: str, reply: bytes, call: Any, sent: str | None) -> Any:
        """The reply frame; learns from the reply's metadata whether ``address`` shares this host."""
        self._forget(sent)
        if self.shm is None:
            return reply
        self._learn(address, call)
        if reply[: len(REF_MAGIC)] == REF_MAGIC:
            return self.shm.take(reply)
        return reply

    def _forget(self, sent: str | None) -> None:
        if sent is not None and self.shm is not None:
            self.shm.discard(sent)

    def close(self) -> None:
        """Stop the servers (calls in progress get 5 s to finish), the connections and thread pools."""
        stopped = self._server.stop(5) if self._server is not None else None
        if self._sockets is not None:
            self._sockets.close(5)
        with self._connect_lock:
            connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            if conn is not None:
                conn.close()
        self._deadlines.close()
        if stopped is not None:
            stopped.wait(10)
        if self.shm is not None:
            self.shm.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._streams.shutdown(wait=False, cancel_futures=True)


def _chunks(parts: list[Any], size: int) -> Iterator[bytes]:
    """The concatenation of ``parts`` cut into messages of ``size`` bytes at most (one, if empty)."""
    pending: list[memoryview] = []
    filled, sent = 0, False
    for part in parts:
        view = memoryview(part).cast("B")
        while view.nbytes:
            piece = view[: size - filled]
            pending.append(piece)
            filled += piece.nbytes
            view = view[piece.nbytes :]
            if filled == size:
                yield b"".join(pending)
                pending, filled, sent = [], 0, True
    if pending or not sent:
        yield b"".join(pending)


def _abort_locally(code: grpc.StatusCode, message: str) -> None:
    raise ValueError(message)


def _marker(metadata: Any) -> str | None:
    for item in metadata or ():
        if item[0] == METADATA_KEY:
            return str(item[1])
    return None


def _error(exc: grpc.RpcError) -> Exception:
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    text = f"{getattr(code, 'name', code)}: {detail}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TransportTimeout(text)
    if code in _REFUSED:
        return TransportRefused(text)
    return TransportUnavailable(text)


class _TokenCheck(grpc.ServerInterceptor):  # type: ignore[misc]
    """The token check of a synchronous server: calls without the token never reach a handler."""

    def __init__(self, token: str) -> None:
        self._token = token

        def deny(request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token: this worker requires one")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(deny)

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        """Pass authenticated calls on; answer the others with a handler that aborts."""
        if token_matches(details.invocation_metadata, self._token):
            return continuation(details)
        return self._deny_stream if details.method == STREAM_METHOD else self._deny
