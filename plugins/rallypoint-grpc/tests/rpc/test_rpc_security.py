"""The RPC transport's refusals: each refused call executes nothing (and a test proves it)."""

from __future__ import annotations

import json
import math
import operator
import pickle
import socket
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc.api import use_agent
from rallypoint.rpc.wire import pack
from rallypoint_grpc.rpc.transport import METHOD

from ..certs import make_certs
from . import rpc_group as g


class Evil:
    """Unpickling this writes a file: proof that a pickle was (or was not) loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.write_text, (self.path, "pwned"))


def _raw_call(address: str, frame: bytes, token: str | None) -> bytes:
    with grpc.insecure_channel(address) as channel:
        metadata = () if token is None else (("authorization", f"Bearer {token}"),)
        return channel.unary_unary(METHOD)(frame, timeout=10, metadata=metadata)  # type: ignore[no-any-return]


def _call_frame(fn: str, args: Any) -> bytes:
    header = {"v": 1, "op": "call", "src": "intruder", "ser": "safe", "fn": fn, "args": args}
    return pack(json.dumps(header).encode())


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_calls_without_the_token_are_refused_and_run_nothing(token: str | None) -> None:
    with g.rpc_group(2) as agents:
        with pytest.raises(grpc.RpcError) as info:
            _raw_call(agents[1].info.address, _call_frame(f"{g.__name__}:add", [1, 2]), token)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert g.CALLS == []
        # the same frame with the token runs
        reply = _raw_call(agents[1].info.address, _call_frame(f"{g.__name__}:add", [1, 2]), g.TOKEN)
        assert b'"ok":3' in reply
        assert g.CALLS == ["add"]


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_torch_mode_still_refuses_callers_outside_the_job(token: str | None) -> None:
    """mode = "torch" opens the program's functions to the job's members only (#36)."""
    frame = _call_frame(f"{g.__name__}:not_exposed_counted", [7])
    with g.rpc_group(2, program=True) as agents:
        with pytest.raises(grpc.RpcError) as info:
            _raw_call(agents[1].info.address, frame, token)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert g.CALLS == []
        # a member of the job (the token) calls it without @rpc.expose; outside the program, refused
        assert b'"ok":7' in _raw_call(agents[1].info.address, frame, g.TOKEN)
        assert g.CALLS == ["not_exposed_counted"]
        for path in ("os:system", "subprocess:run", "torch:load", f"{g.__name__}:__name__"):
            reply = _raw_call(agents[1].info.address, _call_frame(path, ["echo"]), g.TOKEN)
            assert b"RpcRefused" in reply, path
        assert g.CALLS == ["not_exposed_counted"]


def test_an_agent_with_another_token_is_refused() -> None:
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        agents[0].transport._metadata = (("authorization", "Bearer other"),)  # type: ignore[attr-defined]
        with pytest.raises(rpc.RpcRefused, match="UNAUTHENTICATED"):
            rpc.rpc_sync("w1", g.add, args=(1, 2))
        assert g.CALLS == []


def test_functions_that_are_not_exposed_are_refused_and_run_nothing(tmp_path: Path) -> None:
    target = tmp_path / "ran"
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        with pytest.raises(rpc.RpcRefused, match="not exposed"):
            rpc.rpc_sync("w1", g.not_exposed, args=(str(target),))
        for path in ("os:system", "builtins:eval", "subprocess:run", f"{g.__name__}:_private", "nope", "a:b.__class__"):
            reply = _raw_call(agents[1].info.address, _call_frame(path, ["echo"]), g.TOKEN)
            assert b"RpcRefused" in reply, path
        # a private method of an exposed class, through the RRef protocol
        rref = rpc.remote("w1", g.Counter, args=(1,))
        header = {"op": "method", "rref": rref.rref_id, "method": "_secret"}
        with pytest.raises(rpc.RpcRefused, match="private"):
            agents[0].send(agents[1].info, header, {"args": [], "kwargs": {}}, 10, "test").wait()
        with pytest.raises(AttributeError):
            rref.rpc_sync()._secret()
    assert not target.exists()
    assert g.CALLS == []


def test_instances_of_classes_that_are_not_exposed_do_not_travel(tmp_path: Path) -> None:
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        with pytest.raises(rpc.SerializationError, match="safe serializer"):
            rpc.rpc_sync("w1", g.add, args=(g.Marker(), 1))
        # a forged object of a class the callee does not expose
        forged = {"$": "obj", "cls": f"{g.__name__}:Marker", "state": {}}
        reply = _raw_call(agents[1].info.address, _call_frame(f"{g.__name__}:add", [forged, 1]), g.TOKEN)
        assert b"RpcRefused" in reply
    assert g.CALLS == []


def test_a_pickle_under_the_safe_serializer_is_refused_and_never_loaded(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    with g.rpc_group(2, pickle_on=(0,)) as agents, use_agent(agents[0]):
        with pytest.raises(rpc.RpcRefused, match="safe one"):
            rpc.rpc_sync("w1", g.add, args=(Evil(target), 1))
        # a pickle leaf smuggled in a message that claims the safe serializer
        header = {"v": 1, "op": "call", "src": "w0", "ser": "safe", "fn": f"{g.__name__}:add",
                  "args": [{"$": "pickle", "b": 0}, 1]}  # fmt: skip
        frame = pack(json.dumps(header).encode(), [pickle.dumps(Evil(target))])
        reply = _raw_call(agents[1].info.address, frame, g.TOKEN)
        assert b"RpcRefused" in reply
        assert b"pickled value" in reply
    assert not target.exists()
    assert g.CALLS == []


def test_pickle_is_an_explicit_opt_in_on_both_sides(tmp_path: Path) -> None:
    with g.rpc_group(2, pickle_on=(0, 1)) as agents, use_agent(agents[0]):
        assert rpc.rpc_sync("w1", g.identity, args=(Path("/x"),)) == Path("/x")
        assert rpc.rpc_sync("w1", operator.add, args=(1, 2)) == 3  # any importable function


def test_modules_in_allow_are_callable() -> None:
    with g.rpc_group(2) as agents, use_agent(agents[0]), pytest.raises(rpc.RpcRefused, match="not exposed"):
        rpc.rpc_sync("w1", torch.add, args=(torch.ones(1), torch.ones(1)))
    with g.rpc_group(2, allow=("torch", "math")) as agents, use_agent(agents[0]):
        assert torch.equal(rpc.rpc_sync("w1", torch.add, args=(torch.ones(1), torch.ones(1))), torch.full((1,), 2.0))
        assert rpc.rpc_sync("w1", math.hypot, args=(3, 4)) == 5.0
        with pytest.raises(rpc.RpcRefused, match="_operator:mul: it is not exposed"):
            rpc.rpc_sync("w1", operator.mul, args=(3, 4))  # operator.mul lives in _operator


def test_tls_and_mutual_tls(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    tls = {"tls_ca": str(certs.ca), "tls_cert": str(certs.server_cert), "tls_key": str(certs.server_key)}
    for mutual in (False, True):
        with g.rpc_group(2, mutual_tls=mutual, **tls) as agents, use_agent(agents[0]):
            assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3
            with pytest.raises(grpc.RpcError):  # plain text to a TLS port gets nowhere
                _raw_call(agents[1].info.address, _call_frame(f"{g.__name__}:add", [1, 2]), g.TOKEN)


def test_garbage_and_oversized_messages_never_crash_a_worker() -> None:
    with g.rpc_group(2, max_message_bytes=1 << 20) as agents, use_agent(agents[0]):
        address = agents[1].info.address
        bad = [b"", b"garbage", b"RPR1" + b"\xff" * 8, pack(b"{" * 100_000), pack(b'{"v":1,"op":"call"}', [b"x"]),
               pack(json.dumps({"v": 1, "op": "call", "fn": 5, "args": {"$": "tensor", "b": 9}}).encode()),
               pack(json.dumps({"v": 1, "op": "incref", "rref": "x", "n": -1}).encode())]  # fmt: skip
        for frame in bad:
            reply = _raw_call(address, frame, g.TOKEN)
            assert b"err" in reply, frame[:20]
        with pytest.raises(grpc.RpcError) as info:
            _raw_call(address, b"x" * (2 << 20), g.TOKEN)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:  # not even HTTP/2
            sock.sendall(b"\x00" * 4096 + b"GET / HTTP/1.1\r\n\r\n")
        assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3  # still serving
