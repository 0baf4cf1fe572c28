"""A node's check-in on the gRPC backend: one CheckIn call, applied once, persisted; the steps for old servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from rallypoint.rendezvous.backend import SupportsCheckIn, check_in
from rallypoint_grpc.rendezvous.backend import GrpcBackend
from rallypoint_grpc.rendezvous.limits import Limits, StoreError
from rallypoint_grpc.rendezvous.server import RendezvousService
from rallypoint_grpc.rendezvous.store import Store

from .recording import RecordingBackend


def test_the_store_checks_in_once_and_logs_it(tmp_path: Path) -> None:
    store = Store(data_dir=tmp_path)
    store.set("run", "round/header", '{"round":0}', None)
    claim = ("job", '"fingerprint"')
    found, count, claimed = store.check_in("run", "round/", "round/count", "round/closed", claim, request_id="r1")
    assert set(found) == {"round/header"}
    assert count == 1
    assert claimed is not None
    assert claimed[0] == '"fingerprint"'
    # sent again after a lost reply: the same answer, counted once
    assert store.check_in("run", "round/", "round/count", "round/closed", claim, request_id="r1") == (
        found,
        count,
        claimed,
    )
    # a second node of the same job: the claim is there already, its ticket is 2; the listing is
    # the one before its writes
    found, count, _ = store.check_in("run", "round/", "round/count", "round/closed", claim, request_id="r2")
    assert count == 2
    assert found["round/count"][0] == "1"
    store.close()
    again = Store(data_dir=tmp_path)  # a restarted server: the claim and the tickets are in the log
    assert again.get("run", "job") == claimed
    assert again.get("run", "round/count") is not None
    assert again.get("run", "round/count")[0] == "2"  # type: ignore[index]
    again.close()


def test_a_refused_node_takes_nothing() -> None:
    store = Store()
    store.set("run", "job", '"another job"', None)
    found, count, claimed = store.check_in("run", "round/", "round/count", "round/closed", ("job", '"mine"'))
    assert (found, count) == ({}, None)
    assert claimed is not None
    assert claimed[0] == '"another job"'
    store.set("run", "round/closed", "true", None)
    _, count, claimed = store.check_in("run", "round/", "round/count", "round/closed", ("other", '"mine"'))
    assert (count, claimed) == (None, None)  # the marker stops the claim too
    assert store.get("run", "other") is None
    assert store.get("run", "round/count") is None
    store.set("run", "text", '"x"', None)
    with pytest.raises(StoreError, match="not an integer") as refused:
        store.check_in("run", "x/", "text", "nothing", ("mine", '"m"'))
    assert refused.value.code == "precondition"
    assert store.get("run", "mine") is None


def test_a_check_in_over_the_limits_writes_nothing(tmp_path: Path) -> None:
    store = Store(Limits(max_value_bytes=64, max_total_bytes=40), data_dir=tmp_path)
    store.set("run", "round/count", "9", None)
    with pytest.raises(StoreError, match="limit is 40"):  # the claim fits, the bigger count does not
        store.check_in("run", "round/", "round/count", "round/closed", ("job", '"' + "x" * 23 + '"'))
    assert store.get("run", "job") is None
    assert store.get("run", "round/count") == ("9", 1)
    store.close()
    again = Store(data_dir=tmp_path)  # nor in the log
    assert again.get("run", "job") is None
    again.close()


def test_a_check_in_is_one_call(serve: Any) -> None:
    server = serve()
    backend = RecordingBackend(server.address, "run-one")
    assert isinstance(backend, SupportsCheckIn)
    backend.set("round/header", {"round": 0})
    first = check_in(backend, "round/", "round/count", unless="round/closed", claim=("job", {"fp": "a"}))
    second = check_in(backend, "round/", "round/count", unless="round/closed", claim=("job", {"fp": "a"}))
    other = check_in(backend, "round/", "round/count", unless="round/closed", claim=("job", {"fp": "b"}))
    assert (first.count, second.count, other.count) == (1, 2, None)
    assert set(second.entries) == {"round/header", "round/count"}
    assert second.claimed is not None
    assert second.claimed.value == {"fp": "a"}
    assert other.claimed == second.claimed
    assert backend.counts() == {"Set": 1, "CheckIn": 3}


def test_an_older_server_gets_the_steps(serve: Any, monkeypatch: pytest.MonkeyPatch, no_sessions: None) -> None:
    async def unimplemented(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    monkeypatch.setattr(RendezvousService, "CheckIn", unimplemented)
    server = serve()
    backend = RecordingBackend(server.address, "run-old")
    first = check_in(backend, "round/", "round/count", unless="round/closed", claim=("job", {"fp": "a"}))
    second = check_in(backend, "round/", "round/count", unless="round/closed", claim=("job", {"fp": "a"}))
    assert (first.count, second.count) == (1, 2)
    # asked once, then never again: the listing (the marker is under its prefix), the claim, the add
    assert backend.counts() == {"CheckIn": 1, "List": 2, "CompareAndSet": 2, "Add": 2}


def test_the_stub_is_made_once_per_channel(serve: Any, monkeypatch: pytest.MonkeyPatch, no_sessions: None) -> None:
    """Making a stub builds a callable for every method of the service: it was made on each call.

    (Of a server without sessions, where each operation is a unary call on the stub.)
    """
    import rallypoint_grpc.rendezvous.backend as backend_module

    made: list[Any] = []
    real = backend_module.pb_grpc.RendezvousStub

    def counting(channel: Any) -> Any:
        made.append(channel)
        return real(channel)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(backend_module.pb_grpc, "RendezvousStub", counting)
    server = serve()
    backend = GrpcBackend(server.address, "run-stub")
    backend.set("a", 1)
    backend.get("a")
    check_in(backend, "round/", "round/count", unless="round/closed")
    assert len(made) == 1
    # another channel (a forked child's, say) gets a stub of its own
    other = backend_module.get_channel(server.address, None, max_message_bytes=backend._max + 1)
    monkeypatch.setattr(backend_module, "get_channel", lambda *args, **kwargs: other)
    assert backend.get("a") is not None
    assert made == [made[0], other]
