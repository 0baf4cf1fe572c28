"""A node's join on the gRPC backend: one CreateAndAdd call, applied once, persisted; two calls for old servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from rallypoint.rendezvous.backend import create_and_add
from rallypoint_grpc.rendezvous.limits import Limits, StoreError
from rallypoint_grpc.rendezvous.server import RendezvousService
from rallypoint_grpc.rendezvous.store import Store

from .recording import RecordingBackend


def test_the_store_creates_and_counts_once(tmp_path: Path) -> None:
    store = Store(data_dir=tmp_path)
    assert store.create_and_add("run", "join/0/a", '"a"', "count/0", 1, request_id="r1") == (True, None, 1)
    assert store.create_and_add("run", "join/0/a", '"a"', "count/0", 1, request_id="r1") == (True, None, 1)  # retried
    created, there, total = store.create_and_add("run", "join/0/a", '"again"', "count/0", 1, request_id="r2")
    assert (created, total) == (False, 0)
    assert there is not None
    assert there[0] == '"a"'
    assert store.create_and_add("run", "join/0/b", '"b"', "count/0", 1)[2] == 2
    store.set("run", "text", '"x"', None)
    with pytest.raises(StoreError, match="not an integer") as refused:
        store.create_and_add("run", "join/0/c", '"c"', "text", 1)
    assert refused.value.code == "precondition"
    assert store.get("run", "join/0/c") is None
    store.close()
    again = Store(data_dir=tmp_path)  # a restarted server: both writes of each join are in the log
    assert again.get("run", "count/0") is not None
    assert again.get("run", "count/0")[0] == "2"  # type: ignore[index]
    assert again.get("run", "join/0/b") is not None
    again.close()


def test_a_join_over_the_limits_writes_nothing() -> None:
    store = Store(Limits(max_value_bytes=64, max_total_bytes=40))
    store.set("run", "count/0", "9", None)
    with pytest.raises(StoreError, match="limit is 40"):
        store.create_and_add("run", "join/0/a", '"' + "x" * 20 + '"', "count/0", 1000000)
    assert store.get("run", "join/0/a") is None
    assert store.get("run", "count/0") == ("9", 1)


def test_a_join_is_one_call(serve: Any) -> None:
    server = serve()
    backend = RecordingBackend(server.address, "run-one")
    assert create_and_add(backend, "join/0/a", {"n": "a"}, "count/0") == (True, None, 1)
    assert create_and_add(backend, "join/0/b", {"n": "b"}, "count/0") == (True, None, 2)
    assert backend.counts() == {"CreateAndAdd": 2}


def test_an_older_server_gets_two_calls(serve: Any, monkeypatch: pytest.MonkeyPatch, no_sessions: None) -> None:
    async def unimplemented(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    monkeypatch.setattr(RendezvousService, "CreateAndAdd", unimplemented)
    server = serve()
    backend = RecordingBackend(server.address, "run-old")
    assert create_and_add(backend, "join/0/a", {"n": "a"}, "count/0") == (True, None, 1)
    assert create_and_add(backend, "join/0/b", {"n": "b"}, "count/0") == (True, None, 2)
    created, there, _ = create_and_add(backend, "join/0/a", {"n": "x"}, "count/0")
    assert not created
    assert there is not None
    assert there.value == {"n": "a"}
    # asked once, then never again
    assert backend.counts() == {"CreateAndAdd": 1, "CompareAndSet": 3, "Add": 2}
