"""What a client sends a ``rallypoint rdzv serve`` is bounded: key and id lengths, and JSON that is JSON.

A 100 KB key and a value of ``NaN`` used to be stored (both valid to the key alphabet and to
Python's ``json``); the server now refuses them with ``INVALID_ARGUMENT`` and stores nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from rallypoint_grpc._proto import rendezvous_pb2 as pb
from rallypoint_grpc._proto import rendezvous_pb2_grpc as pb_grpc
from rallypoint_grpc.rendezvous.limits import Limits, StoreError
from rallypoint_grpc.rendezvous.store import Store

from .conftest import ServerProcess

LONG = "k" * 100_000


@pytest.fixture
def stub(server: ServerProcess) -> Iterator[Any]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.RendezvousStub(channel)  # type: ignore[no-untyped-call]


def refused(call: Any, request: Any) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    return str(info.value.details())


@pytest.mark.parametrize(
    ("op", "request_", "says"),
    [
        ("Set", pb.SetRequest(space="run", key=LONG, value="1"), "key 'kkkk"),
        ("Set", pb.SetRequest(space="run", key="a/" + LONG, value="1"), "is longer than 4096 characters"),
        ("Set", pb.SetRequest(space=LONG, key="k", value="1"), "run id 'kkkk"),
        ("Set", pb.SetRequest(space="run", key="k", value="1", request_id=LONG), "request id 'kkkk"),
        ("Get", pb.GetRequest(space="run", key=LONG), "is longer than 4096 characters"),
        ("List", pb.ListRequest(space="run", prefix=LONG + "/"), "key prefix 'kkkk"),
        ("Set", pb.SetRequest(space="run", key="k", value="NaN"), "value of 'k' is not JSON text (NaN is not JSON)"),
        ("Set", pb.SetRequest(space="run", key="k", value="[1, -Infinity]"), "(-Infinity is not JSON)"),
        ("CompareAndSet", pb.CompareAndSetRequest(space="run", key="k", value="Infinity"), "(Infinity is not JSON)"),
    ],
)
def test_the_server_refuses_what_is_unbounded_or_not_json(stub: Any, op: str, request_: Any, says: str) -> None:
    assert says in refused(getattr(stub, op), request_)
    assert dict(stub.List(pb.ListRequest(space="run", prefix=""), timeout=10).entries) == {}  # nothing stored
    stub.Set(pb.SetRequest(space="run", key="ok", value="[1.5]"), timeout=10)  # and it still serves


def test_the_bounds_are_limits_of_the_store() -> None:
    store = Store(Limits(max_key_bytes=8, max_request_id_bytes=4))
    store.set("run", "12345678", "1", None, request_id="1234")
    with pytest.raises(StoreError, match="key '123456789' is longer than 8 characters"):
        store.set("run", "123456789", "1", None)
    with pytest.raises(StoreError, match="request id '12345' is longer than 4 characters"):
        store.set("run", "k", "1", None, request_id="12345")
