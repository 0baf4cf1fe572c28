"""The caller's side of the persistent sockets (:mod:`rallypoint_grpc.rpc.socket_server`).

One :class:`ClientConnection` per peer carries the requests of every thread. Replies are read
by whoever is waiting for one: a thread in ``rpc_sync`` reads the socket itself when nobody else
does (its reply then wakes nobody), hands any other reply to its owner, and passes the reading
on when it has its own. While asynchronous calls are outstanding, a helper thread of the
connection reads for them. At any moment at most one thread reads (the *reader*); the others
wait on a lock of their own that the reader releases when their reply is in, or to make them
the next reader.
"""

from __future__ import annotations

import _thread
import contextlib
import heapq
import itertools
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from rallypoint.rpc.transport import Reply, TransportRefused, TransportTimeout, TransportUnavailable
from rallypoint_grpc.rpc.socket_server import HEAD, MAGIC, REFUSED, REPLY, REQUEST, ProtocolError, send_all

__all__ = ["ClientConnection", "Deadlines", "NotSent", "connect"]

_OK = 0
_UNIX_BUF = 4 << 20
_BUFFER = 1 << 16
_HELPER_POLL = 0.05


class NotSent(TransportUnavailable):
    """The request did not leave whole: the connection had ended (the peer ran nothing of it).

    The peer runs a request only once it has read it to its last byte, and the write that failed
    wrote none of the bytes it was given: at most a first part of the request reached the peer,
    which it drops with the connection. So the call may be made again on a new connection.
    """


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
    """A thread in :meth:`ClientConnection.call_blocking`, blocked on ``lock`` (held from the start).

    ``status`` is ``None`` until the reply (or an error, status ``-1``) is in; ``lead``: it was
    made the reader; ``signalled``: ``lock`` was released and the waiter has not woken yet.
    """

    __slots__ = ("data", "lead", "lock", "signalled", "status")

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.status: int | None = None
        self.data: Any = None
        self.lead = False
        self.signalled = False

    def signal(self) -> None:
        """Wake the waiter (the caller holds the connection's lock)."""
        if not self.signalled:
            self.signalled = True
            self.lock.release()

    def woke(self, acquired: bool) -> bool:
        """After the wait on ``lock`` (``acquired``: it returned holding it): whether it was signalled.

        Called under the connection's lock. A signal that came just as the wait timed out left
        ``lock`` released: it is taken back here, so that ``lock`` is held again and the next
        :meth:`signal` (the waiter may be made the reader later) has something to release.
        """
        if self.signalled and not acquired:
            acquired = self.lock.acquire(False)  # released by that signal: returns at once
        self.signalled = False
        return acquired


class _Inbox:
    """Buffered reads of whole messages from a socket, and a wait for data with a timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray(_BUFFER)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        #: Rung to interrupt the wait of the reader (the helper), e.g. when a blocking call could read.
        self.bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.poll = select.poll()
        self.poll.register(sock, select.POLLIN)
        self.poll.register(self.bell, select.POLLIN)

    def ready(self, timeout: float | None) -> bool:
        """Whether a message has begun to arrive (waits ``timeout`` seconds at most; ``None``: forever).

        ``False`` also when the bell rang (the reader then looks at its situation again).
        """
        if self.end > self.start:
            return True
        events = self.poll.poll(None if timeout is None else max(0, int(timeout * 1000) + 1))
        if any(fd == self.bell for fd, _ in events):
            with contextlib.suppress(OSError):
                os.eventfd_read(self.bell)
            return any(fd != self.bell for fd, _ in events)
        return bool(events)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.bell)

    def read(self, out: memoryview) -> None:
        """Fill ``out`` exactly (raises :class:`ProtocolError` when the peer closes first)."""
        want, at = out.nbytes, 0
        while at < want:
            if self.end > self.start:
                n = min(want - at, self.end - self.start)
                out[at : at + n] = self.view[self.start : self.start + n]
                self.start += n
                at += n
            elif want - at >= _BUFFER:  # large: straight into the destination
                got = self.sock.recv_into(out[at:], want - at)
                if not got:
                    raise ProtocolError("connection closed")
                at += got
            else:
                got = self.sock.recv_into(self.view, _BUFFER)
                if not got:
                    raise ProtocolError("connection closed")
                self.start, self.end = 0, got


class ClientConnection:
    """One socket to a peer, shared by every thread of this worker (see the module docstring)."""

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
        self._async = 0  # asynchronous calls among the pending
        self._blocking = 0  # blocking calls among the pending
        self._helper_reads = False
        self._reading = False  # a reader is appointed
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._inbox = _Inbox(sock)
        self._head = bytearray(HEAD.size)
        self._helper: threading.Thread | None = None
        self._wake = _thread.allocate_lock()
        self._wake.acquire()
        self.broken: str | None = None

    # ------------------------------------------------------------- sending
    def _send(self, rid: int, frame: list[Any], pending: _Waiter | Reply) -> None:
        size = sum(memoryview(p).nbytes for p in frame)
        if size > self.max_frame_bytes:
            raise TransportRefused(
                f"RESOURCE_EXHAUSTED: a frame of {size} bytes is larger than max_frame_bytes ({self.max_frame_bytes})"
            )
        token = self._token()
        head = HEAD.pack(MAGIC, REQUEST, 0, len(token), 0, rid, size) + token
        with self._lock:
            if self.broken is not None:
                raise NotSent(self.broken)
            self._pending[rid] = pending
            if isinstance(pending, _Waiter):
                self._blocking += 1
            else:
                self._async += 1
        try:
            with self._send_lock:
                send_all(self.sock, [head, *frame])
        except OSError as exc:
            why = f"connection to {self.peer} lost: {exc}"
            if isinstance(exc, BrokenPipeError | ConnectionResetError):
                why += " (the peer closed it: it exited, or it logged why it closed the connection)"
            with self._lock:  # this call fails here, not among the others that the connection's end fails
                if self._pending.pop(rid, None) is not None:
                    if isinstance(pending, _Waiter):
                        self._blocking -= 1
                    else:
                        self._async -= 1
            self._fail(why)
            raise NotSent(why) from None

    def call_blocking(self, frame: list[Any], timeout: float | None) -> Any:
        """Send ``frame`` and wait for the reply frame in this thread; raises transport errors.

        :class:`NotSent`: the request could not leave (nothing of it ran).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        rid = next(self._ids)
        waiter = _Waiter()
        self._send(rid, frame, waiter)
        with self._lock:
            lead = not self._reading
            self._reading = True
            ring = self._helper_reads
        if ring:  # the helper gives the reading to this thread (its reply then wakes nobody)
            with contextlib.suppress(OSError):
                os.eventfd_write(self._inbox.bell, 1)
        while True:
            if lead:
                if not self._lead(waiter, deadline):
                    self._give_up(rid, waiter, timeout)
                break
            left = None if deadline is None else deadline - time.monotonic()
            acquired = waiter.lock.acquire(timeout=-1 if left is None else max(left, 0))
            with self._lock:
                woken = waiter.woke(acquired)
                lead, waiter.lead = waiter.lead, False
                done = waiter.status is not None
            if done and lead:
                self._hand_over(waiter)
            if done:
                break
            if not woken and not lead:
                self._give_up(rid, waiter, timeout)
        return _result(waiter.status, waiter.data)

    def _give_up(self, rid: int, waiter: _Waiter, timeout: float | None) -> None:
        """The deadline passed: raise a timeout, unless the reply came in meanwhile."""
        with self._lock:
            gone = self._pending.pop(rid, None) is not None
            self._blocking -= gone
            lead, waiter.lead = waiter.lead, False
        if lead:  # made the reader just now: pass it on
            self._hand_over(waiter)
        if gone:
            raise TransportTimeout(f"DEADLINE_EXCEEDED: no reply from {self.peer} within {timeout:g}s")

    def call(self, frame: list[Any], timeout: float | None, reply: Reply) -> None:
        """Send ``frame``; ``reply`` is called once, by the reader (or the deadline thread).

        Raises :class:`NotSent` (and ``reply`` is not called) when the request could not leave.
        """
        rid = next(self._ids)
        try:
            self._send(rid, frame, reply)
        except TransportRefused as exc:
            reply(None, exc)
            return
        if timeout is not None:
            self._deadlines.add(time.monotonic() + timeout, rid, self)
        with self._lock:
            wake = not self._reading
            self._reading = True
            self._helper_reads = self._helper_reads or wake
        if wake:
            self._wake_helper()

    def expire(self, rid: int) -> None:
        """The deadline of asynchronous call ``rid`` passed: fail it if it is still waiting."""
        with self._lock:
            pending = self._pending.pop(rid, None)
            if pending is not None and not isinstance(pending, _Waiter):
                self._async -= 1
        if pending is not None and not isinstance(pending, _Waiter):
            _deliver(pending, -1, TransportTimeout(f"DEADLINE_EXCEEDED: no reply from {self.peer} in time"))

    # ------------------------------------------------------------- reading
    def _lead(self, until: _Waiter | None, deadline: float | None) -> bool:
        """Read replies as the reader until ``until`` has its reply; ``False``: ``deadline`` passed first.

        ``until`` ``None`` (the helper): while asynchronous calls are outstanding. Hands the
        reading on when it stops.
        """
        try:
            while True:
                with self._lock:
                    if until is not None and until.status is not None:
                        return True
                    if until is None and (not self._async or self._blocking):
                        return True  # nothing to read for, or a blocking call can read
                if until is None:  # the helper looks again now and then (calls that expired)
                    if not self._inbox.ready(_HELPER_POLL):
                        continue
                else:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    if not self._inbox.ready(left):
                        continue  # the deadline (or a stale bell): look again
                self._read_one()
        except (OSError, ValueError, ProtocolError) as exc:
            self._fail(f"connection to {self.peer} lost: {exc}")
            return True
        finally:
            self._hand_over(until)

    def _read_one(self) -> None:
        head = self._head
        self._inbox.read(memoryview(head))
        magic, kind, status, _, _, rid, length = HEAD.unpack(head)
        if magic != MAGIC or kind != REPLY or length > self.max_frame_bytes:
            raise ProtocolError(f"{self.peer} sent something that is not a reply")
        body = memoryview(bytearray(length))
        self._inbox.read(body)
        with self._lock:
            pending = self._pending.pop(rid, None)
            if isinstance(pending, _Waiter):
                self._blocking -= 1
                pending.status, pending.data = status, body
                pending.signal()
                return
            if pending is not None:
                self._async -= 1
        if pending is not None:
            _deliver(pending, status, body)

    def _hand_over(self, stopping: _Waiter | None) -> None:
        """The reader stops: a thread waiting in a blocking call reads on.

        Else, for asynchronous calls, the helper does; else nobody until the next call.
        """
        with self._lock:
            self._reading = self._helper_reads = False
            if self.broken is not None:
                return
            if self._blocking:
                for item in self._pending.values():
                    if isinstance(item, _Waiter) and item.status is None and item is not stopping:
                        self._reading = item.lead = True
                        item.signal()
                        return
            if not self._async:
                return
            self._reading = self._helper_reads = True
        self._wake_helper()

    def _wake_helper(self) -> None:
        if self._helper is None:
            self._helper = threading.Thread(target=self._help, name="rpc-replies", daemon=True)
            self._helper.start()
        else:
            with contextlib.suppress(RuntimeError):
                self._wake.release()

    def _help(self) -> None:
        while self.broken is None:
            self._lead(None, None)
            self._wake.acquire()

    def _fail(self, why: str) -> None:
        with self._lock:
            if self.broken is None:
                self.broken = why
            pending, self._pending, self._async, self._blocking = self._pending, {}, 0, 0
            for item in pending.values():
                if isinstance(item, _Waiter):
                    item.status, item.data = -1, TransportUnavailable(why)
                    item.signal()
        with contextlib.suppress(RuntimeError):
            self._wake.release()
        for item in pending.values():
            if not isinstance(item, _Waiter):
                _deliver(item, -1, TransportUnavailable(why))

    def close(self) -> None:
        """Close the socket (calls still waiting fail as unavailable)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self._fail(f"connection to {self.peer} closed by this worker")
        with self._send_lock, contextlib.suppress(OSError):
            self.sock.close()
        self._inbox.close()


def _result(status: int | None, data: Any) -> Any:
    if status == _OK:
        return data
    if status == -1:
        raise data
    text = bytes(data).decode("utf-8", "replace")
    if status == REFUSED:
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
