"""The rendezvous gRPC server: ``grpc.aio`` (asyncio) on one event loop thread.

The service keeps its state in a :class:`~rallypoint_grpc.store.Store` touched only from the
event loop, so each call is atomic without locks. A watch is one coroutine awaiting an
:class:`asyncio.Event` on its stream: thousands of waiting nodes cost thousands of small
coroutines, not threads, and no one polls.

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
from rallypoint_grpc.store import Limits, Store, StoreError
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

_CODES = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def _entry(pair: tuple[str, int] | None) -> pb.Entry | None:
    return None if pair is None else pb.Entry(value=pair[0], version=pair[1])


def _entries(found: dict[str, tuple[str, int]]) -> dict[str, pb.Entry]:
    return {k: pb.Entry(value=t, version=v) for k, (t, v) in found.items()}


class RendezvousService(pb_grpc.RendezvousServicer):
    """The ``rallypoint.rendezvous.v1.Rendezvous`` service over a :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls = 0

    async def _run(self, context: grpc.aio.ServicerContext, op: Callable[[], T]) -> T:
        self.calls += 1
        try:
            return op()
        except StoreError as exc:
            await context.abort(_CODES[exc.code], str(exc))
            raise  # unreachable: abort raises

    async def Get(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        found = await self._run(context, lambda: self.store.get(request.space, request.key))
        return pb.GetReply(entry=_entry(found))

    async def Set(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        ttl = request.ttl if request.HasField("ttl") else None
        version = await self._run(
            context, lambda: self.store.set(request.space, request.key, request.value, ttl, request.request_id)
        )
        return pb.SetReply(version=version)

    async def CompareAndSet(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        ttl = request.ttl if request.HasField("ttl") else None
        version = request.version if request.HasField("version") else None
        written, current = await self._run(
            context,
            lambda: self.store.compare_and_set(
                request.space, request.key, request.value, version, ttl, request.request_id
            ),
        )
        return pb.CompareAndSetReply(written=written, entry=_entry(current))

    async def Add(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        total = await self._run(
            context, lambda: self.store.add(request.space, request.key, request.amount, request.request_id)
        )
        return pb.AddReply(total=total)

    async def CreateAndAdd(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        created, current, total = await self._run(
            context,
            lambda: self.store.create_and_add(
                request.space, request.key, request.value, request.counter, request.amount, request.request_id
            ),
        )
        return pb.CreateAndAddReply(created=created, entry=_entry(current), total=total)

    async def CheckIn(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        claim = (request.claim_key, request.claim_value) if request.HasField("claim_key") else None
        found, count, claimed = await self._run(
            context,
            lambda: self.store.check_in(
                request.space, request.prefix, request.counter, request.unless, claim, request.request_id
            ),
        )
        return pb.CheckInReply(
            entries=_entries(found),
            count=count,
            claimed=_entry(claimed),
        )

    async def SetMany(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        items = dict(request.items)
        version = await self._run(context, lambda: self.store.set_many(request.space, items, request.request_id))
        return pb.SetManyReply(version=version)

    async def Delete(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        version = request.version if request.HasField("version") else None
        deleted = await self._run(
            context, lambda: self.store.delete(request.space, request.key, version, request.request_id)
        )
        return pb.DeleteReply(deleted=deleted)

    async def List(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """See the .proto file."""
        found = await self._run(context, lambda: self.store.list(request.space, request.prefix))
        return pb.ListReply(entries=_entries(found))

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """Hold the stream until the watched key (or prefix) changes or the timeout passes."""
        store = self.store
        version = request.version if request.HasField("version") else None
        versions = dict(request.versions)
        args = (request.space, request.key, request.prefix)
        deadline = time.monotonic() + min(max(0.0, request.timeout), store.limits.max_watch_seconds)

        def check() -> pb.WatchEvent | None:
            if not store.changed(*args, version, versions):
                return None
            if request.prefix:
                return pb.WatchEvent(changed=True)
            # A key watch's change comes with the entry that differs (and the keys asked for with
            # it, such as the waiting node's seat): the watcher need not read them.
            also = _entries(store.entries(request.space, list(request.also))) if request.also else None
            return pb.WatchEvent(changed=True, entry=_entry(store.get(request.space, request.key)), also=also)

        while True:
            change = await self._run(context, check)
            if change is not None:
                yield change
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                yield pb.WatchEvent(changed=False)
                return
            event = await self._run(context, lambda: store.arm(*args))
            next_expiry = store.expire(store.space(request.space))
            if next_expiry is not None:  # wake for a lease that ends first
                remaining = min(remaining, max(0.001, next_expiry - store.clock()))
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
            finally:
                store.disarm(*args, event)


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
        limits: see :class:`~rallypoint_grpc.store.Limits`.
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
