"""The persistent sockets of the grpc RPC transport: which link is used, the token on every call, hostile bytes."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import grpc
import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc.api import use_agent
from rallypoint.rpc.wire import pack
from rallypoint_grpc.rpc.socket_server import HEAD, MAGIC
from rallypoint_grpc.rpc.transport import HELLO_METHOD

from ..certs import make_certs
from . import rpc_group as g

BEARER = f"Bearer {g.TOKEN}".encode()


def _family(agents: list[Any]) -> Any:
    conn = agents[0].transport._connections.get(agents[1].info.address)
    return None if conn is None else conn.sock.family


def _request(frame: bytes, token: bytes = BEARER, rid: int = 7) -> bytes:
    return HEAD.pack(MAGIC, 1, 0, len(token), 0, rid, len(frame)) + token + frame


def _read_reply(sock: socket.socket) -> tuple[int, int, bytes]:
    data = b""
    while len(data) < HEAD.size:
        chunk = sock.recv(HEAD.size - len(data))
        assert chunk, "the worker closed the connection instead of replying"
        data += chunk
    magic, kind, status, _, _, rid, length = HEAD.unpack(data)
    assert (magic, kind) == (MAGIC, 2)
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return rid, status, body


def _call_frame(fn: str, args: Any) -> bytes:
    return pack(json.dumps({"v": 1, "op": "call", "src": "intruder", "ser": "safe", "fn": fn, "args": args}).encode())


def _tcp(agent: Any) -> socket.socket:
    return socket.create_connection(("127.0.0.1", agent.transport._sockets.tcp_port), timeout=10)


def _closed(sock: socket.socket) -> bool:
    """Whether the worker closed ``sock`` (EOF or reset within 10 s)."""
    sock.settimeout(10)
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(("opts", "family"), [({}, socket.AF_UNIX), ({"same_host_shm": False}, socket.AF_INET)])
def test_calls_take_a_unix_socket_on_one_host_and_tcp_otherwise(opts: dict[str, Any], family: Any) -> None:
    with g.rpc_group(3, **opts) as agents, use_agent(agents[0]):
        big = torch.rand(1 << 18)
        assert torch.equal(rpc.rpc_sync("w1", g.identity, args=(big,)), big)
        assert _family(agents) == family
        assert torch.equal(rpc.rpc_async("w1", g.identity, args=(big,)).wait(), big)
        futures = [rpc.rpc_async("w1", g.add, args=(i, 1)) for i in range(50)]  # many in flight on one socket
        assert [f.wait() for f in futures] == list(range(1, 51))
        rref = rpc.remote("w2", g.Counter, args=(torch.ones(2),))
        assert torch.equal(rpc.rpc_sync("w1", g.fetch, args=(rref,)).value, torch.ones(2))  # w1 calls w2
        assert torch.equal(rref.rpc_sync().add(torch.ones(2)), torch.full((2,), 2.0))
        assert g.CALLS == ["add"] * 50


def test_every_socket_call_needs_the_token_and_a_refused_one_runs_nothing() -> None:
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3  # the socket is open
        g.CALLS.clear()
        agents[0].transport._metadata = (("authorization", "Bearer other"),)  # type: ignore[attr-defined]
        with pytest.raises(rpc.RpcRefused, match="UNAUTHENTICATED"):
            rpc.rpc_sync("w1", g.add, args=(1, 2))
        with pytest.raises(rpc.RpcRefused, match="UNAUTHENTICATED"):
            rpc.rpc_async("w1", g.add, args=(1, 2)).wait()
        assert g.CALLS == []
        with _tcp(agents[1]) as sock:
            for token in (b"", b"Bearer wrong", BEARER[:-1] + b"x"):
                sock.sendall(_request(_call_frame(f"{g.__name__}:add", [1, 2]), token))
                assert _read_reply(sock)[1] == 1  # refused
            assert g.CALLS == []
            sock.sendall(_request(_call_frame(f"{g.__name__}:add", [1, 2]), rid=9))
            rid, status, body = _read_reply(sock)
            assert (rid, status) == (9, 0)
            assert b'"ok":3' in body
        assert g.CALLS == ["add"]


def test_hello_needs_the_token() -> None:
    with g.rpc_group(2) as agents, grpc.insecure_channel(agents[1].info.address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(HELLO_METHOD)(b"", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_garbage_and_oversized_messages_on_the_socket_never_crash_a_worker(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rallypoint_grpc.rpc.socket_server")
    with g.rpc_group(2, max_frame_bytes=1 << 20) as agents, use_agent(agents[0]):
        attacks = [
            b"garbage" * 10,
            HEAD.pack(b"XXXX", 1, 0, 0, 0, 1, 0),
            HEAD.pack(MAGIC, 2, 0, 0, 0, 1, 0),  # a reply sent to a server
            HEAD.pack(MAGIC, 1, 0, 65000, 0, 1, 0),  # a token longer than any
            HEAD.pack(MAGIC, 1, 0, len(BEARER), 0, 1, 1 << 62) + BEARER,  # a body larger than the limit
            HEAD.pack(MAGIC, 1, 0, 8, 0, 1, 1 << 40) + b"Bearer x",  # wrong token, huge body
            _request(b"x" * 100)[:-50],  # cut short
        ]
        for attack in attacks:
            with _tcp(agents[1]) as sock:
                sock.sendall(attack)
                if attack is attacks[4]:
                    assert b"max_frame_bytes" in _read_reply(sock)[2]
                if attack is attacks[5]:
                    assert b"UNAUTHENTICATED" in _read_reply(sock)[2]
                sock.shutdown(socket.SHUT_WR)
                assert _closed(sock), attack[:30]
        # the worker says why it closed each of them (the sender only sees a connection that ended)
        closed = [r.getMessage() for r in caplog.records if "closed the connection from 127.0.0.1:" in r.getMessage()]
        assert len(closed) == len(attacks), closed
        assert sum("not a request of the rallypoint RPC protocol" in m for m in closed) == 4
        assert any(f"a frame of {1 << 62} bytes, over max_frame_bytes ({1 << 20})" in m for m in closed)
        assert any(f"without the job's token, and a body of {1 << 40} bytes" in m for m in closed)
        assert any("in the middle of a message" in m for m in closed)
        caplog.clear()
        for frame in (b"", b"RPR1" + b"\xff" * 8, pack(b"{" * 10_000)):  # a bad frame gets an error reply
            with _tcp(agents[1]) as sock:
                sock.sendall(_request(frame))
                _, status, body = _read_reply(sock)
                assert status == 0
                assert b"err" in body
        assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3  # still serving
        with pytest.raises(rpc.RpcRefused, match="max_frame_bytes"):
            rpc.rpc_sync("w1", g.identity, args=(torch.rand(1 << 19),))
        assert g.CALLS == ["add"]
    assert not [r for r in caplog.records if "closed the connection" in r.getMessage()]  # clean ends say nothing


def test_a_call_on_a_connection_the_peer_closed_is_made_once_on_a_new_one() -> None:
    """A request that could not leave ran nowhere: it is sent again on a new connection, and runs once."""
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3
        assert _family(agents) == socket.AF_UNIX
        for call in (
            lambda: rpc.rpc_sync("w1", g.add, args=(2, 2)),
            lambda: rpc.rpc_async("w1", g.add, args=(2, 2)).wait(),
        ):
            first = agents[0].transport._connections[agents[1].info.address]  # type: ignore[attr-defined]
            for conn in list(agents[1].transport._sockets._connections):  # type: ignore[attr-defined]
                conn.close()
            assert call() == 4
            assert first.broken is not None
            assert "the peer closed it" in first.broken
            assert agents[0].transport._connections[agents[1].info.address] is not first  # type: ignore[attr-defined]
        assert g.CALLS == ["add"] * 3


@pytest.mark.parametrize("kind", ["blocking", "async"])
def test_a_call_whose_peer_closed_its_socket_and_offers_none_now_goes_over_grpc(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    from rallypoint_grpc.rpc import transport as rpc_transport

    with g.rpc_group(2) as agents, use_agent(agents[0]):
        assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3
        for conn in list(agents[1].transport._sockets._connections):  # type: ignore[attr-defined]
            conn.close()

        def unreachable(kind: str, where: Any, timeout: float) -> socket.socket:
            raise ConnectionRefusedError(f"{kind} {where}: refused (a firewall, in this test)")

        monkeypatch.setattr(rpc_transport, "connect", unreachable)
        call = rpc.rpc_sync if kind == "blocking" else (lambda *a, **k: rpc.rpc_async(*a, **k).wait())
        assert call("w1", g.add, args=(2, 2)) == 4
        assert agents[0].transport._connections[agents[1].info.address] is None  # type: ignore[attr-defined]
        assert g.CALLS == ["add", "add"]


def test_a_request_that_cannot_leave_raises_not_sent_and_names_the_peer() -> None:
    from rallypoint_grpc.rpc.socket_client import ClientConnection, Deadlines, NotSent

    ours, theirs = socket.socketpair()
    theirs.close()
    deadlines = Deadlines()
    conn = ClientConnection(ours, "10.0.0.9:4000", lambda: BEARER, deadlines, 1 << 20)
    try:
        with pytest.raises(NotSent, match=r"10\.0\.0\.9:4000 lost: .*Broken pipe \(the peer closed it: it exited, or"):
            conn.call_blocking([b"frame"], 5)
        replies: list[Any] = []
        with pytest.raises(NotSent):  # also when the connection is known to be broken: the caller may try again
            conn.call([b"frame"], 5, lambda data, err: replies.append(err))
        assert replies == []  # not answered: the caller decides what to do
        assert conn._pending == {}
    finally:
        conn.close()
        deadlines.close()


def test_with_tls_no_tcp_socket_is_offered(tmp_path: Any) -> None:
    certs = make_certs(tmp_path / "certs")
    tls = {"tls_ca": str(certs.ca), "tls_cert": str(certs.server_cert), "tls_key": str(certs.server_key)}
    with g.rpc_group(2, **tls) as agents, use_agent(agents[0]):
        assert agents[1].transport._sockets.tcp_port is None  # type: ignore[attr-defined]
        assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3
        assert _family(agents) == socket.AF_UNIX  # one host: the user's private Unix socket
    with g.rpc_group(2, same_host_shm=False, **tls) as agents, use_agent(agents[0]):
        assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3
        assert _family(agents) is None  # TLS over gRPC


def test_a_handler_that_blocks_does_not_hold_up_the_others_on_its_socket() -> None:
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        slow = [rpc.rpc_async("w1", g.wait_release, args=(30,)) for _ in range(12)]
        start = time.monotonic()
        assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3
        assert time.monotonic() - start < 10
        assert not any(f.done() for f in slow)
        g.RELEASE.set()
        assert [f.wait(30) for f in slow] == ["released"] * 12
        # the spare threads of the connection go away again, down to a few
        conn = next(iter(agents[1].transport._sockets._connections))  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while conn._threads > 9 and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert conn._threads <= 9


def test_threads_that_mix_blocking_and_asynchronous_calls_and_timeouts_all_get_their_replies() -> None:
    with g.rpc_group(2) as agents:
        errors: list[BaseException] = []

        def worker(seed: int) -> None:
            try:
                with use_agent(agents[0]):
                    for i in range(60):
                        kind = (seed + i) % 4
                        if kind == 0:
                            assert rpc.rpc_sync("w1", g.add, args=(i, seed)) == i + seed
                        elif kind == 1:
                            futures = [rpc.rpc_async("w1", g.add, args=(i, k)) for k in range(3)]
                            assert [f.wait(30) for f in futures] == [i, i + 1, i + 2]
                        elif kind == 2:
                            with pytest.raises(rpc.RpcTimeout):  # a call that times out, as the reader or not
                                rpc.rpc_sync("w1", g.wait_release, args=(0.2,), timeout=0.01)
                        else:
                            fut = rpc.rpc_async("w1", g.add, args=(i, 1))
                            assert rpc.rpc_sync("w1", g.add, args=(i, 2)) == i + 2
                            assert fut.wait(30) == i + 1
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(t.is_alive() for t in threads), "a caller is stuck"
        assert errors == []


def test_a_peer_whose_sockets_cannot_be_reached_is_called_over_grpc(monkeypatch: pytest.MonkeyPatch) -> None:
    from rallypoint_grpc.rpc import transport as rpc_transport

    def unreachable(kind: str, where: Any, timeout: float) -> socket.socket:
        raise ConnectionRefusedError(f"{kind} {where}: refused (a firewall, in this test)")

    monkeypatch.setattr(rpc_transport, "connect", unreachable)
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        big = torch.rand(1 << 18)
        assert torch.equal(rpc.rpc_sync("w1", g.identity, args=(big,)), big)
        assert rpc.rpc_async("w1", g.add, args=(1, 2)).wait() == 3
        address = agents[1].info.address
        assert address in agents[0].transport._connections  # type: ignore[attr-defined]
        assert agents[0].transport._connections[address] is None  # type: ignore[attr-defined]


def test_socket_directories_of_killed_workers_are_removed_by_the_next_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed with SIGKILL cannot remove its Unix socket's directory; the next one on the host does."""
    import shutil
    from pathlib import Path

    from rallypoint_grpc.rpc.socket_server import SocketServer

    base = Path(tempfile.mkdtemp(prefix="rp-sweep-", dir="/tmp"))  # short: socket paths are limited
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        stale = base / f"rallypoint-rpc-p{int(dead.stdout)}-abc123"
        live = base / f"rallypoint-rpc-p{os.getpid()}-def456"
        unrelated = base / "rallypoint-rpc-ghi789"  # no pid in the name (made before names carried one)
        elsewhere = base / f"rallypoint-rpc-p{int(dead.stdout)}-jkl012"  # pid of another namespace: it answers
        for d in (stale, live, unrelated, elsewhere):
            d.mkdir()
        for d in (stale, live, unrelated):
            (d / "s").write_text("")  # a socket file nobody listens on
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listening.bind(str(elsewhere / "s"))
        listening.listen(1)
        monkeypatch.setattr(tempfile, "gettempdir", lambda: str(base))
        server = SocketServer(lambda frame: [b""], g.TOKEN, 1 << 20)
        try:
            path = server.listen_unix()
        finally:
            server.close(0)
        assert path is not None
        assert Path(path).parent.parent == base
        assert Path(path).parent.name.startswith(f"rallypoint-rpc-p{os.getpid()}-")
        assert not stale.exists()
        assert live.exists()
        assert unrelated.exists()
        assert elsewhere.exists()
        listening.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_signal_that_comes_as_a_blocking_wait_times_out_is_taken_back() -> None:
    """A blocking caller's wait timed out just as another thread signalled it (made it the reader).

    The caller then cleared the flag but left the waiter's lock released, and the next signal (the
    caller appointed reader again by the helper before it gave up) released it a second time:
    "RuntimeError: release unlocked lock" in the helper thread, whose dead reading left the other
    callers' replies unread (seen once in CI: four calls timed out after 30 s).
    """
    from rallypoint_grpc.rpc.socket_client import _Waiter

    waiter = _Waiter()
    acquired = waiter.lock.acquire(timeout=0.01)  # the wait times out...
    waiter.signal()  # ...and a signal comes in right then
    assert not acquired
    assert waiter.woke(acquired)  # it counts as woken, and the lock is held again
    assert waiter.lock.locked()
    waiter.signal()  # the next signal has a lock to release
    assert waiter.lock.acquire(timeout=1)
    assert waiter.woke(True)
    assert not waiter.woke(waiter.lock.acquire(timeout=0.01))  # no signal: a plain timeout
