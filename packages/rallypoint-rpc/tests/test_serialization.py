"""The safe serializer, the frame format and the exposure rules (no transport involved)."""

from __future__ import annotations

import json
import math
import pickle
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc.errors import RpcRefused, SerializationError
from rallypoint.rpc.exposure import Exposure, callable_path
from rallypoint.rpc.serialization import Decoder, Encoder, dumps_tree, loads_tree
from rallypoint.rpc.wire import ALIGN, pack, pack_parts, unpack


@rpc.expose
class Point:
    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = x, y


@rpc.expose
def exposed(x: int) -> int:
    return x


class Hidden:
    pass


def hidden() -> None:
    pass


def roundtrip(value: Any, *, allow_pickle: bool = False, exposure: Exposure | None = None) -> Any:
    enc = Encoder(allow_pickle=allow_pickle)
    tree = enc.add(value)
    header, buffers = unpack(pack(dumps_tree(tree), enc.out.buffers))
    decoder = Decoder(exposure or Exposure(), "w1", allow_pickle=allow_pickle)
    return decoder.decode(loads_tree(header), buffers)


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -(10**30), 1.5, "é", [1, [2]], (1, (2,)), {"a": 1, 2: (3,)}, {1, 2}, frozenset({3}),
     b"\x00\xff", bytearray(b"ab"), 1 + 2j, {(1, 2): [None]}],
)  # fmt: skip
def test_plain_data_round_trips_with_its_types(value: Any) -> None:
    out = roundtrip(value)
    assert out == value
    assert type(out) is type(value)


def test_non_finite_floats() -> None:
    out = roundtrip([math.inf, -math.inf, math.nan])
    assert out[:2] == [math.inf, -math.inf]
    assert math.isnan(out[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool, torch.uint8])
def test_tensors_travel_as_raw_buffers(dtype: torch.dtype) -> None:
    t = (torch.arange(24) % 3).to(dtype).reshape(2, 3, 4)
    enc = Encoder()
    tree = enc.add({"t": t})
    assert enc.out.buffers[0].nbytes == t.numel() * t.element_size()  # raw bytes, beside the tree
    assert tree["items"][0][1]["shape"] == [2, 3, 4]
    out = roundtrip(t)
    assert out.dtype == dtype
    assert torch.equal(out, t)


def test_views_scalars_empty_and_grad_flags() -> None:
    base = torch.arange(20.0).reshape(4, 5)
    for t in (base.t(), base[1:3, ::2], torch.tensor(3.5), torch.empty(0, 3), torch.ones(2, requires_grad=True)):
        out = roundtrip(t)
        assert out.shape == t.shape
        assert torch.equal(out, t.detach())
        assert out.requires_grad == t.requires_grad


@pytest.mark.parametrize("broadcasts", [False, True])
def test_lazily_conjugated_and_negated_views_travel_as_their_values(broadcasts: bool) -> None:
    z = torch.tensor([1 + 2j, 3 - 4j, -5j])
    for t in (z.conj(), z.conj().imag, z.conj()[:1].expand(3)):  # conj and neg bits: memory != value
        assert t.is_conj() or t.is_neg()
        enc = Encoder(broadcasts=broadcasts)
        out = _decode(enc, enc.add(t))
        assert not out.is_conj()
        assert not out.is_neg()
        assert torch.equal(out, t.resolve_conj().resolve_neg())


def _decode(enc: Encoder, tree: Any) -> Any:
    header, buffers = unpack(pack(dumps_tree(tree), enc.out.buffers))
    return Decoder(Exposure(), "w1").decode(loads_tree(header), buffers)


@pytest.mark.parametrize(
    ("make", "span"),
    [
        (lambda: torch.tensor(2.5).expand(300, 400), 1),  # the gradient of a sum
        (lambda: torch.arange(4.0).reshape(4, 1).expand(4, 1000), 4),
        (lambda: torch.arange(6.0).reshape(2, 1, 3).expand(2, 50, 3), 6),
    ],
)
def test_broadcast_views_travel_as_the_memory_they_span_only_when_asked(make: Any, span: int) -> None:
    t = make()
    enc = Encoder(broadcasts=True)
    tree = enc.add(t)
    assert enc.out.buffers[0].nbytes == span * t.element_size()  # not t.numel() elements
    out = _decode(enc, tree)
    assert out.shape == t.shape
    assert out.stride() == t.stride()
    assert torch.equal(out, t)
    plain = Encoder()  # every other message: a contiguous copy, as before
    tree = plain.add(t)
    assert plain.out.buffers[0].nbytes == t.numel() * t.element_size()
    out = _decode(plain, tree)
    assert out.is_contiguous()
    assert torch.equal(out, t)


def test_a_broadcast_view_with_negative_or_overlapping_strides_still_round_trips() -> None:
    base = torch.arange(5.0)
    for t in (base.flip(0), base.as_strided((3, 3), (1, 1)), base[:1].expand(4)):
        enc = Encoder(broadcasts=True)
        out = _decode(enc, enc.add(t))
        assert torch.equal(out, t)


def test_exposed_objects_travel_as_their_state_and_callables_as_paths() -> None:
    out = roundtrip(Point(1, torch.ones(2)))
    assert isinstance(out, Point)
    assert out.x == 1
    assert torch.equal(out.y, torch.ones(2))
    assert roundtrip(exposed) is exposed
    with pytest.raises(SerializationError, match="safe serializer"):
        roundtrip(Hidden())
    with pytest.raises(SerializationError, match="safe serializer"):
        roundtrip(hidden)
    with pytest.raises(SerializationError, match="lambdas"):
        callable_path(lambda: None)


def test_pickle_leaves_only_with_the_opt_in(tmp_path: Path) -> None:
    assert roundtrip(Path("/x"), allow_pickle=True) == Path("/x")
    enc = Encoder(allow_pickle=True)
    tree = enc.add([Path("/x")])
    with pytest.raises(RpcRefused, match="pickled value"):
        Decoder(Exposure(), "w1").decode(tree, enc.out.buffers)


def test_forged_objects_of_classes_that_are_not_exposed_are_refused() -> None:
    decoder = Decoder(Exposure(), "w1")
    for cls in (f"{__name__}:Hidden", "os:system", "builtins:object", "pathlib:Path"):
        with pytest.raises(RpcRefused):
            decoder.decode({"$": "obj", "cls": cls, "state": {}}, [])
    assert isinstance(Decoder(Exposure([__name__]), "w1").decode({"$": "obj", "cls": f"{__name__}:Hidden"}, []), Hidden)


@pytest.mark.parametrize(
    "tree",
    [{"x": 1}, {"$": "nope"}, {"$": "tuple"}, {"$": "dict", "items": [[1]]}, {"$": "dict", "items": [[[1], 2]]},
     {"$": "bytes", "b": 3}, {"$": "bytes", "b": True}, {"$": "float", "v": "x" * 100},
     {"$": "tensor", "dtype": "float32", "shape": [10**9], "strides": [1], "b": 0},
     {"$": "tensor", "dtype": "object", "shape": [1], "strides": [1], "b": 0},
     {"$": "tensor", "dtype": "float32", "shape": [-1], "strides": [1], "b": 0},
     {"$": "rref", "id": 1, "owner": "w0"}],
)  # fmt: skip
def test_malformed_values_are_errors_not_crashes(tree: Any) -> None:
    with pytest.raises((SerializationError, RpcRefused)):
        Decoder(Exposure(), "w1").decode(tree, [b"abcd"])


def test_deep_nesting_is_refused_both_ways() -> None:
    deep: Any = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(SerializationError, match="deeper"):
        Encoder().add(deep)
    with pytest.raises(SerializationError):
        loads_tree(b"[" * 100_000 + b"]" * 100_000)


@pytest.mark.parametrize(
    "frame",
    [b"", b"RPR1", b"XXXX" + bytes(8), struct.pack("<4sII", b"RPR1", 1 << 30, 0),
     struct.pack("<4sII", b"RPR1", 0, 1) + struct.pack("<Q", 1 << 60), pack(b"{}", [b"abc"])[:-1]],
)  # fmt: skip
def test_truncated_or_lying_frames_are_refused(frame: bytes) -> None:
    with pytest.raises(SerializationError):
        unpack(frame)


def test_frames_carry_header_and_buffers() -> None:
    header, buffers = unpack(pack(b'{"a":1}', [b"xy", memoryview(b""), bytearray(b"z")]))
    assert json.loads(bytes(header)) == {"a": 1}
    assert [bytes(b) for b in buffers] == [b"xy", b"", b"z"]


def test_exposure_rules() -> None:
    import email.utils  # an allowed module imported already; another that is not

    strict = Exposure()
    assert strict.resolve(f"{__name__}:exposed", worker="w") is exposed
    assert strict.resolve(f"{__name__}:Point", worker="w") is Point
    with pytest.raises(RpcRefused, match="not exposed"):
        strict.resolve(f"{__name__}:hidden", worker="w")
    assert "antigravity" not in sys.modules
    with pytest.raises(RpcRefused, match="not imported there"):
        strict.resolve("antigravity:geohash", worker="w")  # a peer never makes a worker import a module
    assert "antigravity" not in sys.modules
    allowed = Exposure(["email"])
    assert allowed.resolve("email.utils:quote", worker="w") is email.utils.quote
    with pytest.raises(RpcRefused, match="'_'"):
        allowed.resolve("email.utils:_has_surrogates", worker="w")
    with pytest.raises(RpcRefused, match="not exposed"):
        Exposure(["email.*"]).resolve("email:message_from_string", worker="w")
    for bad in ("", "x", ":y", "a:b c", "a:1x"):
        with pytest.raises(RpcRefused):
            strict.resolve(bad, worker="w")


def test_a_pickled_rref_is_refused() -> None:
    with pytest.raises(TypeError, match="only as an argument"):
        pickle.dumps(object.__new__(rpc.RRef))


def test_buffers_are_aligned_and_writable_frames_are_used_in_place() -> None:
    t = torch.arange(10, dtype=torch.float64)
    enc = Encoder()
    tree = enc.add([b"abc", t])
    frame = bytearray(b"".join(pack_parts(dumps_tree(tree), enc.out.buffers)))
    header, buffers = unpack(frame)
    base = memoryview(frame).cast("B")
    out = Decoder(Exposure(), "w1").decode(loads_tree(header), buffers)
    assert torch.equal(out[1], t)
    out[1][0] = 42.0  # the tensor lives in the frame's memory: no copy was made
    assert struct.unpack_from("<d", base, len(frame) - t.numel() * 8)[0] == 42.0
    assert (len(frame) - t.numel() * 8) % ALIGN == 0
    readonly = bytes(frame)
    header, buffers = unpack(readonly)
    copy = Decoder(Exposure(), "w1").decode(loads_tree(header), buffers)[1]
    copy[1] = -1.0  # a read-only frame is copied
    assert readonly == bytes(frame)
