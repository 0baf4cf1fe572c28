"""The fast path of the ``grpc`` RPC transport: one persistent socket per pair of workers.

A unary gRPC call costs a few hundred microseconds of Python and thread hand-overs per call.
So after a first gRPC call (``Hello``, token checked by the server's interceptor) tells a caller
where the peer also listens, calls travel over one long-lived socket per pair of workers: a Unix
socket (in a ``0700`` directory of this user) when both share a host, TCP otherwise. TCP is
offered only without TLS; with TLS, calls between hosts stay on gRPC (TLS), calls on one host
use the Unix socket.

Messages (little endian): :data:`HEAD` = magic ``b"RPS1"``, kind (request / reply), status,
token length (u16), reserved (u32), request id (u64), body length (u64); a request then carries
the token and the frame (:mod:`rallypoint.rpc.wire`), a reply the frame or, when refused, the
reason. Every request carries the job's token and is refused (nothing runs) without it; a
header that is not one of ours, a token longer than :data:`MAX_TOKEN` or a body over the frame
limit closes the connection. Nothing a peer sends can raise out of a connection's threads.

Server threads take turns: one reads the next request while the others wait; the reader then
hands the reading over and runs its request itself (no hand-over between a reader thread and a
pool), and a thread is added when none would be left to read (a handler may block, or call back).
"""

from __future__ import annotations

import _thread
import contextlib
import heapq
import hmac
import itertools
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from rallypoint.rpc.transport import Handler, Reply, TransportRefused, TransportTimeout, TransportUnavailable

__all__ = ["HEAD", "MAGIC", "MAX_TOKEN", "ClientConnection", "Deadlines", "SocketServer", "connect"]

MAGIC = b"RPS1"
HEAD = struct.Struct("<4sBBHIQQ")
#: Longest token a request may carry.
MAX_TOKEN = 4096
_REQUEST, _REPLY = 1, 2
_OK, _REFUSED, _FAILED = 0, 1, 2
#: A request with a wrong token and a body up to this size is read and dropped (the connection stays).
_DRAIN = 1 << 20
#: Server threads per connection at most (handlers that block for long hold one each).
_MAX_THREADS = 256
_SPARE = 2
_IOV_MAX = 512
_UNIX_BUF = 4 << 20


class ProtocolError(Exception):
    """A peer sent something that is not a message of ours: the connection is closed."""


def _recv_exact(reader: Any, view: memoryview) -> None:
    if view.nbytes and reader.readinto(view) != view.nbytes:
        raise ProtocolError("connection closed in the middle of a message")


def _send_all(sock: socket.socket, parts: list[Any]) -> None:
    """Write every part (a gather write; partial writes resume where they stopped)."""
    views = [v for v in (memoryview(p).cast("B") for p in parts) if v.nbytes]
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        while views and sent >= views[0].nbytes:
            sent -= views.pop(0).nbytes
        if sent:
            views[0] = views[0][sent:]


def _reader(sock: socket.socket) -> Any:
    return sock.makefile("rb", buffering=1 << 16)


# ------------------------------------------------------------------------------------------------
# Server


class SocketServer:
    """Listens on TCP and/or a Unix socket and serves each connection (see the module docstring)."""

    def __init__(self, handler: Handler, token: str, max_frame_bytes: int) -> None:
        self._handler = handler
        self._token = f"Bearer {token}".encode()
        self.max_frame_bytes = max_frame_bytes
        self._listeners: list[socket.socket] = []
        self._connections: set[_ServerConnection] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._dir: str | None = None
        self.tcp_port: int | None = None
        self.unix_path: str | None = None

    def listen_tcp(self, host: str) -> int:
        """Listen on ``host`` (any free port); returns the port."""
        family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
        sock = socket.create_server((host, 0), family=family, backlog=128)
        self.tcp_port = int(sock.getsockname()[1])
        self._start(sock)
        return self.tcp_port

    def listen_unix(self) -> str | None:
        """Listen on a Unix socket in a new private directory; returns its path (``None`` if impossible)."""
        base = tempfile.gettempdir()
        if len(base) > 60:
            base = "/tmp"
        try:
            self._dir = tempfile.mkdtemp(prefix="rallypoint-rpc-", dir=base)
            path = os.path.join(self._dir, "s")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)
            sock.listen(128)
        except OSError:
            return None
        self.unix_path = path
        self._start(sock)
        return path

    def _start(self, sock: socket.socket) -> None:
        self._listeners.append(sock)
        threading.Thread(target=self._accept, args=(sock,), name="rpc-accept", daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # closed
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _UNIX_BUF)
            conn = _ServerConnection(self, sock)
            with self._lock:
                if self._closed:
                    sock.close()
                    return
                self._connections.add(conn)
            conn.spawn()

    def _gone(self, conn: _ServerConnection) -> None:
        with self._lock:
            self._connections.discard(conn)

    def close(self, grace: float) -> None:
        """Stop accepting and reading; requests in progress get ``grace`` seconds to reply."""
        with self._lock:
            self._closed = True
            connections = list(self._connections)
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in connections:
            conn.stop_reading()
        deadline = time.monotonic() + grace
        for conn in connections:
            conn.wait_idle(deadline)
            conn.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class _ServerConnection:
    """One accepted connection and the threads that take turns reading and serving it."""

    def __init__(self, server: SocketServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.reader = _reader(sock)
        self._read_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._state = threading.Condition()
        self._threads = 0
        self._busy = 0
        self._done = False

    def spawn(self) -> None:
        with self._state:
            self._threads += 1
        threading.Thread(target=self._run, name="rpc-serve", daemon=True).start()

    def _run(self) -> None:
        try:
            while True:
                with self._read_lock:
                    request = None if self._done else self._read()
                    if request is None:
                        break
                    with self._state:
                        self._busy += 1
                        spare = self._threads - self._busy
                    if spare == 0 and self._threads < _MAX_THREADS:
                        self.spawn()
                self._serve(*request)
                with self._state:
                    self._busy -= 1
                    self._state.notify_all()
                    if self._threads - self._busy > _SPARE:
                        self._threads -= 1
                        return  # enough threads wait for the next request
        except BaseException:  # noqa: BLE001 - nothing a peer sends may escape a connection thread
            self._done = True
        with self._state:
            self._threads -= 1
            last = self._threads == 0
        if last:
            self.close()

    def _read(self) -> tuple[int, memoryview] | None:
        """The next authenticated request (id, frame); ``None``: closed (refusals are answered here)."""
        head = bytearray(HEAD.size)
        try:
            if self.reader.readinto(head) != HEAD.size:
                self._done = True
                return None
            while True:
                request = self._read_one(head)
                if request is not None:
                    return request
                _recv_exact(self.reader, memoryview(head))
        except (OSError, ValueError, ProtocolError):
            self._done = True
            return None

    def _read_one(self, head: bytearray) -> tuple[int, memoryview] | None:
        magic, kind, _, token_len, _, rid, length = HEAD.unpack(head)
        if magic != MAGIC or kind != _REQUEST or token_len > MAX_TOKEN:
            raise ProtocolError("not a request of the rallypoint RPC protocol")
        token = bytearray(token_len)
        _recv_exact(self.reader, memoryview(token))
        if not hmac.compare_digest(bytes(token), self.server._token):
            self._reply(rid, _REFUSED, ["UNAUTHENTICATED: missing or wrong token: this worker requires one"])
            if length > _DRAIN:
                raise ProtocolError("unauthenticated")
            _recv_exact(self.reader, memoryview(bytearray(length)))
            return None
        limit = self.server.max_frame_bytes
        if length > limit:
            self._reply(rid, _REFUSED, [f"RESOURCE_EXHAUSTED: frame larger than max_frame_bytes ({limit} bytes)"])
            raise ProtocolError("oversized frame")
        frame = memoryview(bytearray(length))
        _recv_exact(self.reader, frame)
        return rid, frame

    def _serve(self, rid: int, frame: memoryview) -> None:
        try:
            parts = self.server._handler(frame)
        except BaseException as exc:  # noqa: BLE001 - handlers never raise; if one does, the caller hears of it
            self._reply(rid, _FAILED, [f"INTERNAL: {type(exc).__name__}: {exc}"])
            return
        self._reply(rid, _OK, parts)

    def _reply(self, rid: int, status: int, parts: list[Any]) -> None:
        body = [p.encode() if isinstance(p, str) else p for p in parts]
        size = sum(memoryview(p).nbytes for p in body)
        with self._send_lock, contextlib.suppress(OSError):
            _send_all(self.sock, [HEAD.pack(MAGIC, _REPLY, status, 0, 0, rid, size), *body])

    def stop_reading(self) -> None:
        self._done = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RD)

    def wait_idle(self, deadline: float) -> None:
        with self._state:
            while self._busy and (left := deadline - time.monotonic()) > 0:
                self._state.wait(left)

    def close(self) -> None:
        self._done = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with self._send_lock, contextlib.suppress(OSError, ValueError):
            self.reader.close()
            self.sock.close()
        self.server._gone(self)


# ------------------------------------------------------------------------------------------------
# Client


class Deadlines:
    """One thread that fails asynchronous calls whose deadline passed (a heap, not a timer per call)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, ClientConnection]] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._added = 0

    def add(self, when: float, rid: int, conn: ClientConnection) -> None:
        """Fail call ``rid`` of ``conn`` at ``when`` (monotonic) unless its reply came first."""
        with self._cond:
            self._added += 1
            if self._added % 4096 == 0:  # drop the entries of calls that completed
                self._heap = [e for e in self._heap if e[1] in e[2]._pending]
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, (when, rid, conn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rpc-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == rid:
                self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    _, rid, conn = heapq.heappop(self._heap)
                    conn.expire(rid)
                self._cond.wait(self._heap[0][0] - now if self._heap else None)

    def close(self) -> None:
        """Stop the thread (calls still listed are failed by their connections' close)."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()


class _Waiter:
    """A caller blocked in :meth:`ClientConnection.call_blocking`: a lock released by the reader."""

    __slots__ = ("data", "lock", "status")

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.status = -1
        self.data: Any = None


class ClientConnection:
    """One socket to a peer: requests from any thread, replies read by one thread of its own."""

    _ids = itertools.count(1)

    def __init__(
        self, sock: socket.socket, peer: str, token: Callable[[], bytes], deadlines: Deadlines, max_frame_bytes: int
    ) -> None:
        self.sock = sock
        self.peer = peer
        self._token = token
        self._deadlines = deadlines
        self.max_frame_bytes = max_frame_bytes
        self._pending: dict[int, _Waiter | Reply] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self.broken: str | None = None
        self._reader = _reader(sock)
        threading.Thread(target=self._read_loop, name="rpc-replies", daemon=True).start()

    def _send(self, rid: int, frame: list[Any], pending: _Waiter | Reply) -> None:
        size = sum(memoryview(p).nbytes for p in frame)
        if size > self.max_frame_bytes:
            raise TransportRefused(
                f"RESOURCE_EXHAUSTED: a frame of {size} bytes is larger than max_frame_bytes ({self.max_frame_bytes})"
            )
        token = self._token()
        head = HEAD.pack(MAGIC, _REQUEST, 0, len(token), 0, rid, size) + token
        with self._lock:
            if self.broken is not None:
                raise TransportUnavailable(self.broken)
            self._pending[rid] = pending
        try:
            with self._send_lock:
                _send_all(self.sock, [head, *frame])
        except OSError as exc:
            self._pending.pop(rid, None)
            self._fail(f"connection to {self.peer} lost: {exc}")
            raise TransportUnavailable(f"connection to {self.peer} lost: {exc}") from None

    def call_blocking(self, frame: list[Any], timeout: float | None) -> Any:
        """Send ``frame`` and wait for the reply frame in this thread; raises transport errors."""
        rid = next(self._ids)
        waiter = _Waiter()
        self._send(rid, frame, waiter)
        if not waiter.lock.acquire(timeout=-1 if timeout is None else timeout):
            with self._lock:
                timed_out = self._pending.pop(rid, None) is not None
            if timed_out:
                raise TransportTimeout(f"DEADLINE_EXCEEDED: no reply from {self.peer} within {timeout:g}s")
            waiter.lock.acquire()
        return _result(waiter.status, waiter.data)

    def call(self, frame: list[Any], timeout: float | None, reply: Reply) -> None:
        """Send ``frame``; ``reply`` is called once, from the reader thread (or the deadline thread)."""
        rid = next(self._ids)
        try:
            self._send(rid, frame, reply)
        except (TransportRefused, TransportUnavailable) as exc:
            reply(None, exc)
            return
        if timeout is not None:
            self._deadlines.add(time.monotonic() + timeout, rid, self)

    def expire(self, rid: int) -> None:
        """The deadline of call ``rid`` passed: fail it if it is still waiting."""
        with self._lock:
            pending = self._pending.pop(rid, None)
        if pending is not None and not isinstance(pending, _Waiter):
            _deliver(pending, -1, TransportTimeout(f"DEADLINE_EXCEEDED: no reply from {self.peer} in time"))

    def _read_loop(self) -> None:
        head = bytearray(HEAD.size)
        view = memoryview(head)
        try:
            while self._reader.readinto(view) == HEAD.size:
                magic, kind, status, _, _, rid, length = HEAD.unpack(head)
                if magic != MAGIC or kind != _REPLY or length > self.max_frame_bytes:
                    raise ProtocolError(f"{self.peer} sent something that is not a reply")
                body = memoryview(bytearray(length))
                _recv_exact(self._reader, body)
                with self._lock:
                    pending = self._pending.pop(rid, None)
                if isinstance(pending, _Waiter):
                    pending.status, pending.data = status, body
                    pending.lock.release()
                elif pending is not None:
                    _deliver(pending, status, body)
            self._fail(f"{self.peer} closed the connection")
        except (OSError, ValueError, ProtocolError) as exc:
            self._fail(f"connection to {self.peer} lost: {exc}")

    def _fail(self, why: str) -> None:
        with self._lock:
            if self.broken is None:
                self.broken = why
            pending, self._pending = self._pending, {}
        for item in pending.values():
            if isinstance(item, _Waiter):
                item.status, item.data = -1, TransportUnavailable(why)
                item.lock.release()
            else:
                _deliver(item, -1, TransportUnavailable(why))

    def close(self) -> None:
        """Close the socket (calls still waiting fail as unavailable)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self._fail(f"connection to {self.peer} closed by this worker")
        with self._send_lock, contextlib.suppress(OSError, ValueError):
            self._reader.close()
            self.sock.close()


def _result(status: int, data: Any) -> Any:
    if status == _OK:
        return data
    if status == -1:
        raise data
    text = bytes(data).decode("utf-8", "replace")
    if status == _REFUSED:
        raise TransportRefused(text)
    raise TransportUnavailable(text)


def _deliver(reply: Reply, status: int, data: Any) -> None:
    try:
        result = _result(status, data)
    except (TransportRefused, TransportUnavailable, TransportTimeout) as exc:
        reply(None, exc)
        return
    reply(result, None)


def connect(kind: str, where: Any, timeout: float) -> socket.socket:
    """A connected socket: ``kind`` ``"unix"`` (``where`` a path) or ``"tcp"`` (``where`` ``(host, port)``)."""
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _UNIX_BUF)
        except OSError:
            sock.close()
            raise
    else:
        sock = socket.create_connection(where, timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)
    return sock
