"""One long-lived session stream per backend (#38): replies routed to their callers, watches pushed
on the stream, a server restart under it, close() with calls in flight, an older server."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from typing import Any

import grpc
import pytest

from rallypoint.rendezvous.backend import wait_with
from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint_grpc._proto import rendezvous_pb2 as pb
from rallypoint_grpc.rendezvous.backend import GrpcBackend
from rallypoint_grpc.rendezvous.session import Session, SessionClosed, SessionError

from .conftest import ServerProcess


def _run_id() -> str:
    return f"session-{uuid.uuid4().hex[:8]}"


def _sessions(server: Any) -> int:
    """How many session streams the in-process server has opened."""
    return int(server.service.sessions)


def test_replies_reach_their_own_callers_under_concurrency(serve: Any) -> None:
    server = serve()
    backend = GrpcBackend(server.address, _run_id())
    errors: list[str] = []

    def worker(t: int) -> None:
        for i in range(60):
            key = f"k/{t}/{i}"
            version = backend.set(key, {"t": t, "i": i})
            found = backend.get(key)
            if found is None or found.value != {"t": t, "i": i} or found.version != version:
                errors.append(f"{key}: wrote version {version}, read back {found}")
            total = backend.add(f"count/{t}", 1)
            if total != i + 1:
                errors.append(f"count/{t}: {total} after {i + 1} adds")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]
    assert len(backend.list("k/")) == 8 * 60
    assert _sessions(server) == 1  # every operation of the 8 threads went on the backend's one stream


def test_a_watch_is_pushed_on_the_stream_with_its_keys(serve: Any) -> None:
    server = serve()
    run_id = _run_id()
    waiting, writer = GrpcBackend(server.address, run_id), GrpcBackend(server.address, run_id)
    seen = waiting.set("header", {"round": 0})
    writer.set("seat/a", {"rank": 3})
    got: queue.Queue[Any] = queue.Queue()
    for round_ in (1, 2, 3):
        t = threading.Thread(
            target=lambda held=seen: got.put(
                wait_with(waiting, "header", version=held, timeout=20, also=("seat/a", "seat/b"))
            )
        )
        t.start()
        time.sleep(0.2)  # the watch waits on the server
        assert got.empty()
        seen = writer.set("header", {"round": round_})
        change = got.get(timeout=10)
        t.join(10)
        assert change is not None
        assert change.entry is not None
        assert (change.entry.value, change.entry.version) == ({"round": round_}, seen)
        assert change.also["seat/a"] is not None
        assert change.also["seat/a"].value == {"rank": 3}
        assert change.also["seat/b"] is None
    assert _sessions(server) == 2  # three waits, no new stream: one per backend


def test_a_watch_that_times_out_answers_on_the_stream(serve: Any) -> None:
    server = serve()
    backend = GrpcBackend(server.address, _run_id(), call_timeout=5)
    started = time.monotonic()
    assert backend.watch("nothing", version=None, timeout=0.3) is False
    assert 0.25 < time.monotonic() - started < 3
    assert backend.set("after", 1) == 1  # the stream still serves
    assert _sessions(server) == 1


def test_a_server_restart_under_the_stream_is_retried_on_a_new_one(
    start_server: type[ServerProcess], tmp_path: Any
) -> None:
    first = start_server("--data-dir", str(tmp_path))
    backend = GrpcBackend(first.address, _run_id(), call_timeout=5, retry_timeout=20)
    version = backend.set("k", "before")
    waited: queue.Queue[Any] = queue.Queue()
    watcher = threading.Thread(target=lambda: waited.put(backend.watch("k", version=version, timeout=30)))
    watcher.start()
    time.sleep(0.3)
    first.kill()  # the stream breaks under the watch and under the calls that follow
    time.sleep(0.5)
    restarted = start_server("--data-dir", str(tmp_path), port=first.port)
    found = backend.get("k")  # retried until the server is back, on a new stream
    assert found is not None
    assert found.value == "before"
    backend.set("k", "after")
    assert waited.get(timeout=20) is True  # the watch was sent again and saw the write
    watcher.join(10)
    assert restarted.alive()


def test_a_server_gone_for_good_is_reported_as_before(start_server: type[ServerProcess]) -> None:
    server = start_server()
    backend = GrpcBackend(server.address, _run_id(), call_timeout=5, retry_timeout=1)
    backend.set("k", 1)
    server.kill()
    started = time.monotonic()
    with pytest.raises(RendezvousBackendError, match=rf"rendezvous server {server.address} .*unreachable for 1 s"):
        backend.get("k")
    assert time.monotonic() - started < 10


def test_close_fails_the_calls_in_flight_and_a_later_call_opens_a_new_stream(serve: Any) -> None:
    server = serve()
    backend = GrpcBackend(server.address, _run_id(), call_timeout=30, retry_timeout=30)
    outcome: queue.Queue[BaseException | bool] = queue.Queue()

    def wait() -> None:
        try:
            outcome.put(backend.watch("k", version=None, timeout=30))
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.put(exc)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    started = time.monotonic()
    backend.close()
    errors = [outcome.get(timeout=5) for _ in threads]
    assert time.monotonic() - started < 5  # not retried for retry_timeout, nor left to the watch's timeout
    for error in errors:
        assert isinstance(error, RendezvousBackendError), error
        assert server.address in str(error)
        assert "closed" in str(error)
    assert backend.set("k", 1) == 1  # a later call opens a new session
    assert _sessions(server) == 2


def test_an_older_server_without_sessions_gets_unary_calls(serve: Any, no_sessions: None) -> None:
    server = serve()
    backend = GrpcBackend(server.address, _run_id())
    assert backend.set("k", 1) == 1
    assert backend.get("k") is not None
    assert backend.watch("k", version=None, timeout=5) is True
    assert backend._sessions is False  # asked once, then never again


def test_refusals_keep_the_unary_calls_errors(serve: Any) -> None:
    server = serve()
    backend = GrpcBackend(server.address, _run_id())
    backend.set("text", "x")
    with pytest.raises(TypeError, match=r"\(run '.*', Add\): rendezvous key 'text' holds '\"x\"', not an integer"):
        backend.add("text", 1)
    with pytest.raises(ValueError, match="refused the request: ttl"):
        backend.set("k", 1, ttl=-1.0)
    assert backend.add("n", 2) == 2  # the stream serves on after a refused operation
    assert _sessions(server) == 1


def test_a_token_refused_on_the_stream_is_reported(serve: Any) -> None:
    server = serve(token="secret")
    with pytest.raises(RendezvousBackendError, match="refused the call: missing or wrong token"):
        GrpcBackend(server.address, _run_id(), token="wrong").get("k")
    assert GrpcBackend(server.address, _run_id(), token="secret").set("k", 1) == 1


class _SilentCall:
    """A session stream whose server never answers: what a caller sees of a server that hangs."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.cancelled = threading.Event()
        self._wake: asyncio.Future[None] | None = None

    async def write(self, message: Any) -> None:
        self.sent.append(message)

    async def read(self) -> Any:
        self._wake = asyncio.get_running_loop().create_future()
        await self._wake
        raise SessionError(grpc.StatusCode.CANCELLED, "cancelled")

    def cancel(self) -> None:
        self.cancelled.set()
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)


def test_an_operation_without_a_reply_times_out_and_its_watch_is_cancelled() -> None:
    call = _SilentCall()
    session = Session(lambda: call)
    started = time.monotonic()
    with pytest.raises(SessionError) as raised:
        session.call("watch", pb.WatchRequest(space="r", key="k", timeout=10), timeout=0.3)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.25 < time.monotonic() - started < 3
    deadline = time.monotonic() + 5
    while len(call.sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    watch, cancel = call.sent[:2]
    assert watch.WhichOneof("op") == "watch"
    assert (cancel.WhichOneof("op"), cancel.cancel) == ("cancel", watch.id)  # the server lets it go
    session.close()
    assert session.ended
    assert call.cancelled.wait(5)
    with pytest.raises(SessionClosed):
        session.call("get", pb.GetRequest(space="r", key="k"), timeout=1)


class _BrokenCall(_SilentCall):
    """A stream that ends as grpc.aio ends one whose message could not be sent: INTERNAL."""

    async def read(self) -> Any:
        raise SessionError(grpc.StatusCode.INTERNAL, "Internal error from Core")


def test_a_stream_that_broke_under_a_write_is_retried_as_a_lost_connection() -> None:
    session = Session(_BrokenCall)
    with pytest.raises(grpc.RpcError) as raised:
        session.call("get", pb.GetRequest(space="r", key="k"), timeout=5)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE  # retried by the backend, as a dropped connection
    assert "Internal error from Core" in raised.value.details()
    assert session.ended
