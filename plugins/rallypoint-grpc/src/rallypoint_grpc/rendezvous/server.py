"""The rendezvous gRPC server: ``grpc.aio`` (asyncio) on one event loop thread.

The service keeps its state in a :class:`~rallypoint_grpc.rendezvous.store.Store` touched only from
the event loop, so each call is atomic without locks. A watch is one coroutine awaiting an
:class:`asyncio.Event` on its stream: thousands of waiting nodes cost thousands of small coroutines,
not threads, and no one polls.

:class:`RendezvousServer` runs the server on a background thread of the calling process (the
agent-hosted mode and the tests); ``rallypoint rdzv serve`` runs it in the foreground.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import grpc
import grpc.aio

from rallypoint_grpc._proto import rendezvous_pb2 as pb
from rallypoint_grpc._proto import rendezvous_pb2_grpc as pb_grpc
from rallypoint_grpc.rendezvous.limits import Limits, StoreError
from rallypoint_grpc.rendezvous.session_server import CODES, ServerSession
from rallypoint_grpc.rendezvous.store import Store
from rallypoint_grpc.transport import (
    DEFAULT_MAX_MESSAGE_BYTES,
    TlsFiles,
    TokenInterceptor,
    format_endpoint,
    server_credentials,
    server_options,
)

__all__ = ["RendezvousServer", "RendezvousService", "ServerConfig"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_CODES = CODES


def _entry(pair: tuple[str, int] | None) -> pb.Entry | None:
    return None if pair is None else pb.Entry(value=pair[0], version=pair[1])


def _entries(found: dict[str, tuple[str, int]]) -> dict[str, pb.Entry]:
    return {k: pb.Entry(value=t, version=v) for k, (t, v) in found.items()}


class RendezvousService(pb_grpc.RendezvousServicer):
    """The ``rallypoint.rendezvous.v1.Rendezvous`` service over a :class:`Store`.

    Each operation is a plain method from its request to its reply (raising
    :class:`~rallypoint_grpc.rendezvous.limits.StoreError`), served two ways: as its own unary call,
    and as a message of a session stream (:meth:`Session`,
    :mod:`rallypoint_grpc.rendezvous.session_server`).
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        #: Operations served (unary calls and session messages alike).
        self.calls = 0
        #: Session streams opened.
        self.sessions = 0
        #: The operation of each unary method, by the session message's field name too.
        self.operations: dict[str, Callable[[Any], Any]] = {
            "get": self.get,
            "set": self.set,
            "compare_and_set": self.compare_and_set,
            "add": self.add,
            "create_and_add": self.create_and_add,
            "check_in": self.check_in,
            "set_many": self.set_many,
            "delete": self.delete,
            "list": self.list,
        }

    async def _run(self, context: grpc.aio.ServicerContext, op: Callable[[], T]) -> T:
        self.calls += 1
        try:
            return op()
        except StoreError as exc:
            await context.abort(_CODES[exc.code], str(exc))
            raise  # unreachable: abort raises

    # -- the operations -------------------------------------------------------------------
    def get(self, request: Any) -> Any:
        """A ``Get``'s reply."""
        return pb.GetReply(entry=_entry(self.store.get(request.space, request.key)))

    def set(self, request: Any) -> Any:
        """A ``Set``'s reply."""
        ttl = request.ttl if request.HasField("ttl") else None
        return pb.SetReply(version=self.store.set(request.space, request.key, request.value, ttl, request.request_id))

    def compare_and_set(self, request: Any) -> Any:
        """A ``CompareAndSet``'s reply."""
        ttl = request.ttl if request.HasField("ttl") else None
        version = request.version if request.HasField("version") else None
        written, current = self.store.compare_and_set(
            request.space, request.key, request.value, version, ttl, request.request_id
        )
        return pb.CompareAndSetReply(written=written, entry=_entry(current))

    def add(self, request: Any) -> Any:
        """An ``Add``'s reply."""
        return pb.AddReply(total=self.store.add(request.space, request.key, request.amount, request.request_id))

    def create_and_add(self, request: Any) -> Any:
        """A ``CreateAndAdd``'s reply."""
        created, current, total = self.store.create_and_add(
            request.space, request.key, request.value, request.counter, request.amount, request.request_id
        )
        return pb.CreateAndAddReply(created=created, entry=_entry(current), total=total)

    def check_in(self, request: Any) -> Any:
        """A ``CheckIn``'s reply."""
        claim = (request.claim_key, request.claim_value) if request.HasField("claim_key") else None
        found, count, claimed = self.store.check_in(
            request.space, request.prefix, request.counter, request.unless, claim, request.request_id
        )
        return pb.CheckInReply(entries=_entries(found), count=count, claimed=_entry(claimed))

    def set_many(self, request: Any) -> Any:
        """A ``SetMany``'s reply."""
        return pb.SetManyReply(version=self.store.set_many(request.space, dict(request.items), request.request_id))

    def delete(self, request: Any) -> Any:
        """A ``Delete``'s reply."""
        version = request.version if request.HasField("version") else None
        return pb.DeleteReply(deleted=self.store.delete(request.space, request.key, version, request.request_id))

    def list(self, request: Any) -> Any:
        """A ``List``'s reply."""
        return pb.ListReply(entries=_entries(self.store.list(request.space, request.prefix)))

    async def wait(self, request: Any) -> Any:
        """A watch's one event: at the watched key's (or prefix's) change, or ``changed=False`` at the timeout.

        Raises:
            StoreError: the request is invalid, or the server holds too many watches.
        """
        store = self.store
        version = request.version if request.HasField("version") else None
        versions = dict(request.versions)
        args = (request.space, request.key, request.prefix)
        deadline = time.monotonic() + min(max(0.0, request.timeout), store.limits.max_watch_seconds)
        while True:
            if store.changed(*args, version, versions):
                if request.prefix:
                    return pb.WatchEvent(changed=True)
                # A key watch's change comes with the entry that differs (and the keys asked for
                # with it, such as the waiting node's seat): the watcher need not read them.
                also = _entries(store.entries(request.space, list(request.also))) if request.also else None
                return pb.WatchEvent(changed=True, entry=_entry(store.get(request.space, request.key)), also=also)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return pb.WatchEvent(changed=False)
            event = store.arm(*args)
            next_expiry = store.expire(store.space(request.space))
            if next_expiry is not None:  # wake for a lease that ends first
                remaining = min(remaining, max(0.001, next_expiry - store.clock()))
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
            finally:
                store.disarm(*args, event)

    # -- unary calls ----------------------------------------------------------------------
    async def Get(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        return await self._run(context, lambda: self.get(request))

    async def Set(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        return await self._run(context, lambda: self.set(request))

    async def CompareAndSet(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        return await self._run(context, lambda: self.compare_and_set(request))

    async def Add(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        return await self._run(context, lambda: self.add(request))

    async def CreateAndAdd(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        return await self._run(context, lambda: self.create_and_add(request))

    async def CheckIn(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        return await self._run(context, lambda: self.check_in(request))

    async def SetMany(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        return await self._run(context, lambda: self.set_many(request))

    async def Delete(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        return await self._run(context, lambda: self.delete(request))

    async def List(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        return await self._run(context, lambda: self.list(request))

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """Hold the stream until the watched key (or prefix) changes or the timeout passes."""
        self.calls += 1
        try:
            event = await self.wait(request)
        except StoreError as exc:
            await context.abort(_CODES[exc.code], str(exc))
            raise  # unreachable: abort raises
        yield event

    async def Session(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        """Serve one client's session stream until it ends (see :mod:`rallypoint_grpc.rendezvous.session_server`)."""
        self.sessions += 1
        await ServerSession(self, context).serve()


class ServerConfig:
    """How to run a server.

    Args:
        host: the address to bind (an interface address, or ``0.0.0.0`` / ``::`` for all).
        port: the port; 0 picks a free one.
        also: more addresses to bind with the same port (the host's own address, when its name
            maps to loopback and the endpoint names it; see ``backend.host_server``).
        token: the shared token every call must carry (``None``: no token).
        tls: server certificate and key, and the client CA for mutual TLS (``None``: plain TCP).
        data_dir: persist the state here (``None``: memory only).
        limits: see :class:`~rallypoint_grpc.rendezvous.limits.Limits`.
        max_message_bytes: largest request or reply.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        tls: TlsFiles | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        limits: Limits | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        also: tuple[str, ...] = (),
    ) -> None:
        self.host, self.port, self.token, self.tls, self.also = host, port, token, tls, also
        self.data_dir, self.limits, self.max_message_bytes = data_dir, limits or Limits(), max_message_bytes


async def start_server(config: ServerConfig) -> tuple[grpc.aio.Server, RendezvousService, int]:
    """Build, bind and start the aio server; return it, its service and the bound port.

    Raises:
        OSError: the address cannot be bound (in use, or not an address of this host).
    """
    interceptors = [TokenInterceptor(config.token)] if config.token is not None else []
    server = grpc.aio.server(
        interceptors=interceptors,
        options=server_options(config.max_message_bytes),
        maximum_concurrent_rpcs=None,
    )
    service = RendezvousService(Store(config.limits, config.data_dir))
    pb_grpc.add_RendezvousServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    port = config.port
    for host in (config.host, *config.also):  # the first bind picks the port the others share
        address = format_endpoint(host, port)
        try:
            if config.tls is not None:
                bound = server.add_secure_port(address, server_credentials(config.tls))
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpcio raises RuntimeError on a failed bind
            service.store.close()
            raise OSError(f"cannot bind the rendezvous server to {address}: {exc}") from None
        if bound == 0:
            service.store.close()
            raise OSError(f"cannot bind the rendezvous server to {address}")
        port = bound
    await server.start()
    return server, service, port


class RendezvousServer:
    """A rendezvous server on a background thread of this process (its own event loop).

    ``start()`` returns once the port is bound (or raises ``OSError``); ``stop()`` ends it.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.port = 0
        self.service: RendezvousService | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: grpc.aio.Server | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def address(self) -> str:
        """``HOST:PORT`` the server listens on."""
        return format_endpoint(self.config.host, self.port)

    def start(self) -> RendezvousServer:
        """Bind and serve on a daemon thread."""
        ready: list[BaseException | None] = []
        started = threading.Event()

        async def main() -> None:
            self._stopped = asyncio.Event()
            try:
                self._server, self.service, self.port = await start_server(self.config)
            except BaseException as exc:  # noqa: BLE001 - reported to start()
                ready.append(exc)
                started.set()
                return
            ready.append(None)
            started.set()
            await self._stopped.wait()
            await self._server.stop(grace=0.5)
            self.service.store.close()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(main())
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name=f"rallypoint-grpc-server-{self.config.port}", daemon=True)
        self._thread.start()
        started.wait()
        if ready[0] is not None:
            self._thread.join()
            raise ready[0]
        return self

    def call_soon(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run a coroutine on the server's loop and return its result (for tests and statistics)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(30)

    def stop(self) -> None:
        """Stop serving (in-flight calls get half a second) and wait for the thread."""
        loop, stopped, thread = self._loop, self._stopped, self._thread
        if loop is not None and stopped is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopped.set)
            thread.join(10)


async def serve_forever(config: ServerConfig, on_ready: Callable[[int], None]) -> None:
    """Run a server until cancelled (``rallypoint rdzv serve``); ``on_ready(port)`` once bound."""
    server, service, port = await start_server(config)
    on_ready(port)
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(grace=1.0)
        service.store.close()
