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

import contextlib
import hmac
import logging
import os
import re
import shutil
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rallypoint.rpc.transport import DeferredHandler
from rallypoint_grpc.rpc.shared_memory import process_gone

__all__ = ["HEAD", "MAGIC", "MAX_TOKEN", "REFUSED", "REPLY", "REQUEST", "ProtocolError", "SocketServer", "send_all"]

log = logging.getLogger(__name__)

MAGIC = b"RPS1"
HEAD = struct.Struct("<4sBBHIQQ")
#: Longest token a request may carry.
MAX_TOKEN = 4096
REQUEST, REPLY = 1, 2
_OK, REFUSED, _FAILED = 0, 1, 2
#: A request with a wrong token and a body up to this size is read and dropped (the connection stays).
_DRAIN = 1 << 20
#: Server threads per connection at most (handlers that block for long hold one each).
_MAX_THREADS = 256
_SPARE = 8
_IOV_MAX = 512
_UNIX_BUF = 4 << 20
#: A Unix socket directory: ``rallypoint-rpc-p<pid>-<random>`` (the pid of the worker that made it).
_DIR_RE = re.compile(r"^rallypoint-rpc-p([0-9]{1,10})-[A-Za-z0-9_]+$")


class ProtocolError(Exception):
    """A peer sent something that is not a message of ours: the connection is closed."""


def _recv_exact(reader: Any, view: memoryview) -> None:
    if view.nbytes and reader.readinto(view) != view.nbytes:
        raise ProtocolError("it ended the connection in the middle of a message")


def send_all(sock: socket.socket, parts: list[Any]) -> None:
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

    def __init__(self, handler: DeferredHandler, token: str, max_frame_bytes: int) -> None:
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
        sweep_socket_dirs(base)
        try:
            self._dir = tempfile.mkdtemp(prefix=f"rallypoint-rpc-p{os.getpid()}-", dir=base)
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


def sweep_socket_dirs(base: str) -> None:
    """Remove the socket directories of this user's workers that are gone (killed before they could).

    Each directory is named after its worker's pid (``rallypoint-rpc-p<pid>-<random>``). One goes
    when no process has that pid here *and* nothing listens on its socket any more (a worker in
    another pid namespace that shares this directory, as containers sharing ``/tmp`` do, has a
    pid that looks gone from here, but its socket still answers). Another user's is left alone.
    """
    for path in Path(base).glob("rallypoint-rpc-p*-*"):
        match = _DIR_RE.match(path.name)
        if match is None or not process_gone(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            if (
                path.is_dir()
                and not path.is_symlink()
                and path.lstat().st_uid == os.getuid()
                and _unanswered(path / "s")
            ):
                shutil.rmtree(path, ignore_errors=True)


def _unanswered(path: Path) -> bool:
    """Whether nothing listens on the Unix socket at ``path`` (or there is none)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    except OSError:
        return False  # cannot tell (permissions, a full backlog): leave it
    finally:
        probe.close()
    return False


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
        #: Why this worker closes the connection when it is not the peer's doing (logged once, at close).
        self._why: str | None = None

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
        except BaseException as exc:  # noqa: BLE001 - nothing a peer sends may escape a connection thread
            self._why = self._why or f"an unexpected {type(exc).__name__} while serving it: {exc}"
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
        except ProtocolError as exc:
            self._why = self._why or str(exc)
            self._done = True
            return None
        except (OSError, ValueError):
            self._done = True
            return None

    def _read_one(self, head: bytearray) -> tuple[int, memoryview] | None:
        magic, kind, _, token_len, _, rid, length = HEAD.unpack(head)
        if magic != MAGIC or kind != REQUEST or token_len > MAX_TOKEN:
            raise ProtocolError(f"not a request of the rallypoint RPC protocol (it began {bytes(head[:8])!r})")
        token = bytearray(token_len)
        _recv_exact(self.reader, memoryview(token))
        if not hmac.compare_digest(bytes(token), self.server._token):
            self._reply(rid, REFUSED, ["UNAUTHENTICATED: missing or wrong token: this worker requires one"])
            if length > _DRAIN:
                raise ProtocolError(f"a request without the job's token, and a body of {length} bytes (not read)")
            _recv_exact(self.reader, memoryview(bytearray(length)))
            return None
        limit = self.server.max_frame_bytes
        if length > limit:
            self._reply(rid, REFUSED, [f"RESOURCE_EXHAUSTED: frame larger than max_frame_bytes ({limit} bytes)"])
            raise ProtocolError(f"a frame of {length} bytes, over max_frame_bytes ({limit})")
        frame = memoryview(bytearray(length))
        _recv_exact(self.reader, frame)
        return rid, frame

    def _serve(self, rid: int, frame: memoryview) -> None:
        try:
            parts = self.server._handler(frame)
        except BaseException as exc:  # noqa: BLE001 - handlers never raise; if one does, the caller hears of it
            self._reply(rid, _FAILED, [f"INTERNAL: {type(exc).__name__}: {exc}"])
            return
        if isinstance(parts, list):
            self._reply(rid, _OK, parts)
        else:  # an async_execution call: replied when its future completes, this thread goes on reading
            parts.add_done_callback(lambda answer: self._reply(rid, _OK, answer.wait()))

    def _reply(self, rid: int, status: int, parts: list[Any]) -> None:
        body = [p.encode() if isinstance(p, str) else p for p in parts]
        size = sum(memoryview(p).nbytes for p in body)
        with self._send_lock, contextlib.suppress(OSError):
            send_all(self.sock, [HEAD.pack(MAGIC, REPLY, status, 0, 0, rid, size), *body])

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
        why, self._why = self._why, None
        if why is not None:  # the caller then only sees a connection that ended: say here why
            log.warning("RPC: closed the connection from %s: %s", _peer_name(self.sock), why)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with self._send_lock, contextlib.suppress(OSError, ValueError):
            self.reader.close()
            self.sock.close()
        self.server._gone(self)


def _peer_name(sock: socket.socket) -> str:
    """The peer's address (``HOST:PORT``), or "a worker of this host" on a Unix socket."""
    try:
        peer = sock.getpeername()
    except OSError:
        return "a peer"
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return "a worker of this host (Unix socket)"
