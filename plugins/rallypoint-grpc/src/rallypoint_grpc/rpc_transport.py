"""The ``grpc`` RPC transport: frames of :mod:`rallypoint.rpc.wire` over one unary gRPC method.

Each worker runs a ``grpc.aio`` server in a background thread (its own event loop) that hands
every request to a thread pool, and calls its peers through the process's cached channels
(:func:`rallypoint_grpc.transport.get_channel`). Every call carries the job's token; the server's
:class:`~rallypoint_grpc.transport.TokenInterceptor` refuses calls without it before the request
is read. Frames are bytes end to end (no protobuf): tensors travel as raw buffers.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import grpc.aio

from rallypoint.rpc.transport import (
    Handler,
    Reply,
    TransportRefused,
    TransportTimeout,
    TransportUnavailable,
)
from rallypoint_grpc.rpc_options import GrpcRpcOptions
from rallypoint_grpc.transport import (
    TlsFiles,
    TokenInterceptor,
    format_endpoint,
    get_channel,
    read_token,
    server_credentials,
    server_options,
    token_metadata,
)

__all__ = ["METHOD", "GrpcRpcTransport", "create_grpc_rpc_transport"]

#: The one gRPC method RPC frames travel on.
METHOD = "/rallypoint.rpc.Rpc/Call"
_REFUSED = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNIMPLEMENTED,
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
        self._metadata = token_metadata(token)
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="rpc-serve")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._client_tls = self._tls_for_clients()

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
    def serve(self, handler: Handler, host: str) -> str:
        """Start the server on ``host`` (a free port); returns ``HOST:PORT``."""
        started: dict[str, Any] = {}
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(handler, host, started, ready), name="rpc-grpc-server", daemon=True
        )
        self._thread.start()
        ready.wait()
        if "error" in started:
            raise started["error"]
        return format_endpoint(host, started["port"])

    def _run(self, handler: Handler, host: str, started: dict[str, Any], ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._start(handler, host, started))
        except BaseException as exc:  # noqa: BLE001 - reported to serve()
            started["error"] = exc
            ready.set()
            loop.close()
            return
        ready.set()
        loop.run_forever()
        loop.close()

    async def _start(self, handler: Handler, host: str, started: dict[str, Any]) -> None:
        pool, loop = self._pool, asyncio.get_running_loop()

        async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await loop.run_in_executor(pool, handler, request)

        method = grpc.unary_unary_rpc_method_handler(call)
        generic = grpc.method_handlers_generic_handler("rallypoint.rpc.Rpc", {"Call": method})
        server = grpc.aio.server(
            interceptors=[TokenInterceptor(self.token)],
            options=server_options(self.options.max_message_bytes),
        )
        server.add_generic_rpc_handlers((generic,))
        target = format_endpoint(host, 0)
        o = self.options
        if o.tls_cert is not None:
            tls = TlsFiles(cert=o.tls_cert, key=o.tls_key, ca=o.tls_ca if o.mutual_tls else None)
            port = server.add_secure_port(target, server_credentials(tls))
        else:
            port = server.add_insecure_port(target)
        await server.start()
        self._server = server
        started["port"] = port

    # ------------------------------------------------------------- client
    def call(self, address: str, frame: bytes, timeout: float | None, reply: Reply) -> None:
        """Send ``frame`` to ``address``; ``reply`` gets the answer or a transport error."""
        channel = get_channel(address, self._client_tls, max_message_bytes=self.options.max_message_bytes)
        stub = channel.unary_unary(METHOD)
        try:
            future = stub.future(frame, timeout=timeout, metadata=self._metadata)
        except Exception as exc:  # noqa: BLE001 - e.g. a closed channel
            reply(None, TransportUnavailable(str(exc)))
            return

        def done(fut: Any) -> None:
            try:
                reply(fut.result(), None)
            except grpc.RpcError as exc:
                reply(None, _error(exc))
            except Exception as exc:  # noqa: BLE001 - cancelled futures and the like
                reply(None, TransportUnavailable(f"{type(exc).__name__}: {exc}"))

        future.add_done_callback(done)

    def close(self) -> None:
        """Stop the server (calls in progress get 5 s to finish) and its thread pool."""
        loop, server = self._loop, self._server
        if loop is not None and server is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(server.stop(5), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _error(exc: grpc.RpcError) -> Exception:
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    text = f"{getattr(code, 'name', code)}: {detail}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TransportTimeout(text)
    if code in _REFUSED:
        return TransportRefused(text)
    return TransportUnavailable(text)
