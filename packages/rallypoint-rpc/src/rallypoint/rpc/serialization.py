"""How values travel: a JSON tree plus raw buffers. Nothing received is ever unpickled under ``safe``.

A value becomes a JSON-compatible tree in which plain data stays as it is (``None``, booleans,
integers, finite floats, strings, lists) and everything else is a tagged object ``{"$": tag, ...}``:
tuples, dicts (any encodable keys), sets, bytes, non-finite floats, complex numbers, tensors
(dtype, shape, strides, storage offset and a buffer index; the bytes travel beside the tree, not
inside it), RRefs, exposed callables, and instances of exposed classes (their class path and
their state, rebuilt without calling ``__init__``).

With ``serializer = "pickle"`` any other object becomes a ``pickle`` leaf. RRefs and plain
tensors inside a pickled object still travel as themselves (the pickle holds a reference to an
RRef entry or to a tensor tree, resolved by the receiver), so reference counting and distributed
autograd see them wherever they are nested. A worker with the safe serializer refuses a message
that holds a pickle leaf, before anything runs.

In torch's compatibility mode (``[rpc] mode = "torch"``) the functions and classes of the
program's own modules travel like exposed ones.
"""

from __future__ import annotations

import ctypes
import io
import json
import math
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rallypoint.rpc.errors import RpcRefused, SerializationError
from rallypoint.rpc.exposure import Exposure, callable_path, default_allowed, is_exposed
from rallypoint.rpc.gradctx import ACTIVE

__all__ = [
    "Decoder", "Encoded", "Encoder", "MAX_DEPTH", "TENSOR_DTYPES", "attach_reference", "register_reference",
]  # fmt: skip

#: Deepest nesting of containers a value may have (either way).
MAX_DEPTH = 100
#: Tensor dtypes that travel (by their torch name).
TENSOR_DTYPES = (
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "uint8", "int8", "int16", "int32", "int64", "bool",
)  # fmt: skip


class _NoReference:
    """Stands for the reference class until its module registers it: nothing is an instance of it."""


#: How references travel (``{"$": "rref"}`` leaves): the class whose instances travel as
#: references, and how a receiving agent makes one. :mod:`rallypoint.rpc.rref` registers
#: :class:`~rallypoint.rpc.rref.RRef` when it is imported (no RRef can be sent before that), so
#: this module, which that one stands on, never imports it.
_REFERENCES: dict[str, Any] = {"type": _NoReference, "attach": None}


def register_reference(cls: type, attach: Callable[[Any, str, Any], Any]) -> None:
    """Send instances of ``cls`` as references (their ``rref_id`` and ``owner_name()``).

    ``attach(agent, rref_id, owner)`` makes the receiver's object for a reference received by
    ``agent``, owned by the worker ``owner`` (a :class:`~rallypoint.rpc.agent.WorkerInfo`).
    """
    _REFERENCES.update(type=cls, attach=attach)


def attach_reference(agent: Any, rref_id: str, owner: Any) -> Any:
    """The local object for a reference received by ``agent`` (see :func:`register_reference`).

    Raises:
        SerializationError: no reference class is registered in this process.
    """
    attach = _REFERENCES["attach"]
    if attach is None:
        raise SerializationError(
            f"{agent.info.name} received an RRef but this process never imported rallypoint.rpc.rref"
        )
    return attach(agent, rref_id, owner)


@dataclass
class Encoded:
    """An encoded value: the JSON tree, the buffers it points at, the RRefs it holds."""

    tree: Any
    buffers: list[Any] = field(default_factory=list)
    rrefs: list[Any] = field(default_factory=list)


class Encoder:
    """Turns values into :class:`Encoded` trees (one encoder per message).

    Args:
        allow_pickle: pickle what the safe rules cannot express (``serializer = "pickle"``).
        broadcasts: send a tensor whose elements share memory (a broadcast view, such as the
            gradient of a sum) as the memory it spans and its strides, not as a contiguous copy:
            the receiver gets the same view (distributed autograd's gradient messages). Other
            tensors always arrive contiguous.
        exposure: this worker's rules; in torch's compatibility mode the program's own functions
            and classes travel by path like exposed ones.
    """

    def __init__(
        self, *, allow_pickle: bool = False, broadcasts: bool = False, exposure: Exposure | None = None
    ) -> None:
        self.allow_pickle = allow_pickle
        self.broadcasts = broadcasts
        self.exposure = exposure
        self.out = Encoded(tree=None)

    def _program(self, obj: Any) -> bool:
        return self.exposure is not None and self.exposure.program_object(obj)

    def add(self, value: Any) -> Any:
        """Encode ``value`` into this message; returns its tree (buffers and RRefs are collected)."""
        return self._enc(value, 0)

    def _buffer(self, data: Any) -> int:
        self.out.buffers.append(data)
        return len(self.out.buffers) - 1

    def _enc(self, v: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise SerializationError(f"value nested deeper than {MAX_DEPTH} levels")
        if v is None or isinstance(v, bool | int | str):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"$": "float", "v": repr(v)}
        if type(v) is list:
            return [self._enc(x, depth + 1) for x in v]
        if type(v) is tuple:
            return {"$": "tuple", "items": [self._enc(x, depth + 1) for x in v]}
        if type(v) is dict:
            return {"$": "dict", "items": [[self._enc(k, depth + 1), self._enc(x, depth + 1)] for k, x in v.items()]}
        if type(v) in (set, frozenset):
            return {"$": type(v).__name__, "items": [self._enc(x, depth + 1) for x in v]}
        if type(v) in (bytes, bytearray):
            return {"$": type(v).__name__, "b": self._buffer(bytes(v))}
        if isinstance(v, complex):
            return {"$": "complex", "v": [repr(v.real), repr(v.imag)]}
        return self._enc_object(v, depth)

    def _enc_object(self, v: Any, depth: int) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(v, torch.Tensor):
            return self._enc_tensor(v)
        if isinstance(v, _REFERENCES["type"]):
            self.out.rrefs.append(v)
            return {"$": "rref", "id": v.rref_id, "owner": v.owner_name()}
        if callable(v) and (is_exposed(v) or default_allowed(v) or self._program(v)):
            return {"$": "fn", "path": callable_path(v)}
        if is_exposed(type(v)) or (self._program(type(v)) and not self.allow_pickle and not _is_module(v)):
            state = v.__getstate__()
            return {"$": "obj", "cls": callable_path(type(v)), "state": self._enc(state, depth + 1)}
        if self.allow_pickle:
            return {"$": "pickle", "b": self._buffer(self._pickle(v))}
        raise SerializationError(
            f"a {type(v).__module__}.{type(v).__qualname__} cannot travel under the safe serializer: send plain "
            'data, tensors, RRefs or instances of @rpc.expose classes (or opt in to serializer = "pickle")'
        )

    def _pickle(self, v: Any) -> bytes:
        """``v`` pickled, its RRefs and plain tensors kept out of the pickle as references to trees."""
        out = io.BytesIO()
        pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
        torch = sys.modules.get("torch")
        reference = _REFERENCES["type"]

        def persistent_id(obj: Any) -> Any:
            if isinstance(obj, reference):
                self.out.rrefs.append(obj)
                return ("rref", obj.rref_id, obj.owner_name())
            if torch is not None and type(obj) is torch.Tensor:  # a Parameter pickles as one around its data
                return ("tensor", self._enc_tensor(obj))
            return None

        pickler.persistent_id = persistent_id  # type: ignore[method-assign]
        pickler.dump(v)
        return out.getvalue()

    def _enc_tensor(self, t: Any) -> Any:
        # Few torch calls, each cheap: this runs right after the compute it sends (a backward
        # pass's gradient), when the CPU's caches hold that compute's data, not the interpreter's.
        requires_grad = bool(t.requires_grad)
        tag = None
        if requires_grad:
            active = ACTIVE.get()
            if active is not None:  # inside a distributed autograd context: the sender keeps it for backward
                tag = active.record(t)
            t = t.detach()
        if not t.is_cpu:
            t = t.cpu()
        dtype = _dtype_name(t.dtype)
        if dtype not in TENSOR_DTYPES:
            raise SerializationError(f"tensors of dtype {dtype} cannot travel; supported: {', '.join(TENSOR_DTYPES)}")
        if t.is_conj() or t.is_neg():  # lazily conjugated or negated views: their memory is not their value
            t = t.resolve_conj().resolve_neg()
        shape, strides, numel = t.shape, t.stride(), t.numel()
        span = _broadcast_span(shape, strides, numel) if self.broadcasts else None
        if span is not None:  # only the memory the view spans travels (e.g. 1 element of an expanded scalar)
            flat = t.as_strided((span,), (1,))
        elif not t.is_contiguous():
            flat = t = t.contiguous()
            strides = t.stride()
        else:
            flat = t
        out = {
            "$": "tensor",
            "dtype": dtype,
            "shape": list(shape),
            "strides": list(strides),
            "requires_grad": requires_grad,
            "b": self._buffer(_raw_bytes(flat) if numel else b""),
        }
        if tag is not None:
            out["ad"] = tag
        return out


class _Window(ctypes.Array[ctypes.c_ubyte]):
    """Bytes at an address, as long as any tensor: a tensor's bytes are a slice of one laid over it.

    One type for every size: a ctypes type per size would cost microseconds for each new size
    and stay cached by ctypes.
    """

    _type_ = ctypes.c_ubyte
    _length_ = 1 << 62
    tensor: Any  # the owner of the memory under the window


_DTYPE_NAMES: dict[Any, str] = {}
_DTYPES: dict[str, tuple[Any, int]] = {}


def _dtype_name(dtype: Any) -> str:
    """``dtype``'s name without ``torch.`` (cached: a dict lookup on the hot path)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _dtype(name: str) -> tuple[Any, int]:
    """The torch dtype named ``name`` (one of :data:`TENSOR_DTYPES`) and its item size, cached."""
    found = _DTYPES.get(name)
    if found is None:
        import torch

        dtype = getattr(torch, name)
        found = _DTYPES[name] = (dtype, torch.empty((), dtype=dtype).element_size())
    return found


def _raw_bytes(flat: Any) -> memoryview:
    """The bytes of a contiguous (or 1-d span) tensor, without a copy and without numpy.

    numpy is not a dependency of torch: ``Tensor.numpy()`` fails on a clean install. The view
    is a slice of one ctypes array laid over the tensor's memory; the array keeps the tensor
    alive for as long as any view of it exists (the frame is sent after the caller may have
    dropped the tensor). Any dtype works, bfloat16 included: only bytes are read.
    """
    window = _Window.from_address(flat.data_ptr())
    window.tensor = flat  # the memory's owner lives as long as the view
    return memoryview(window).cast("B")[: flat.nbytes]


def _broadcast_span(shape: Any, strides: Any, numel: int) -> int | None:
    """The elements a view spans when some of them share memory (a stride-0 dimension), else ``None``."""
    if not numel or not any(s == 0 and n > 1 for n, s in zip(shape, strides, strict=True)):
        return None
    if any(s < 0 for s in strides):
        return None
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    return span if span < numel else None


class Decoder:
    """Rebuilds values from a tree and its buffers, on the receiving worker.

    Args:
        exposure: which callables and classes this worker accepts.
        worker: this worker's name (for errors).
        allow_pickle: whether ``pickle`` leaves are accepted (``serializer = "pickle"``).
        make_rref: builds the local RRef for ``(rref_id, owner_name)``.
        on_grad: ``on_grad(tensor, tag)`` for a tensor recorded in a distributed autograd
            context by its sender (its ``ad`` tag): returns the tensor to use (a recv node).
    """

    def __init__(
        self,
        exposure: Exposure,
        worker: str,
        *,
        allow_pickle: bool = False,
        make_rref: Callable[[str, str], Any] | None = None,
        on_grad: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        self.exposure = exposure
        self.worker = worker
        self.allow_pickle = allow_pickle
        self.make_rref = make_rref
        self.on_grad = on_grad

    def decode(self, tree: Any, buffers: list[Any]) -> Any:
        """The value of ``tree``. Raises :class:`RpcRefused` or :class:`SerializationError`."""
        return self._dec(tree, buffers, 0)

    def _dec(self, v: Any, bufs: list[Any], depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise SerializationError(f"received value nested deeper than {MAX_DEPTH} levels")
        if v is None or isinstance(v, bool | int | float | str):
            return v
        if isinstance(v, list):
            return [self._dec(x, bufs, depth + 1) for x in v]
        if not isinstance(v, dict) or not isinstance(v.get("$"), str):
            raise SerializationError(f"malformed value received by {self.worker}")
        tag = v["$"]
        simple = _SIMPLE.get(tag)
        if simple is not None:
            return simple(self, v, bufs, depth)
        if tag == "pickle":
            if not self.allow_pickle:
                raise RpcRefused(
                    f"{self.worker} refused a pickled value: it uses the safe serializer "
                    '(serializer = "pickle" must be set on every worker to accept pickles)'
                )
            return self._unpickle(_buf(bufs, v), bufs)
        raise SerializationError(f"{self.worker} received a value of unknown kind {tag!r}")

    def _unpickle(self, data: Any, bufs: list[Any]) -> Any:
        unpickler = pickle.Unpickler(io.BytesIO(bytes(data)))

        def persistent_load(pid: Any) -> Any:
            if isinstance(pid, tuple) and len(pid) == 3 and pid[0] == "rref":
                return self._rref({"id": pid[1], "owner": pid[2]})
            if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "tensor" and isinstance(pid[1], dict):
                return self._grad(_tensor(pid[1], bufs), pid[1])
            raise SerializationError(f"{self.worker} received a pickle with an unknown reference")

        unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
        return unpickler.load()

    def _items(self, v: dict[str, Any], bufs: list[Any], depth: int) -> list[Any]:
        items = v.get("items")
        if not isinstance(items, list):
            raise SerializationError(f"malformed {v['$']} received by {self.worker}")
        return [self._dec(x, bufs, depth + 1) for x in items]

    def _dict(self, v: dict[str, Any], bufs: list[Any], depth: int) -> dict[Any, Any]:
        out = {}
        for pair in self._items(v, bufs, depth):
            if not isinstance(pair, list) or len(pair) != 2:
                raise SerializationError(f"malformed dict received by {self.worker}")
            try:
                out[pair[0]] = pair[1]
            except TypeError:
                raise SerializationError(f"unhashable dict key received by {self.worker}") from None
        return out

    def _object(self, v: dict[str, Any], bufs: list[Any], depth: int) -> Any:
        cls = self.exposure.resolve(str(v.get("cls")), worker=self.worker)
        if not isinstance(cls, type):
            raise RpcRefused(f"{self.worker} refused an object of {v.get('cls')}: not a class")
        self.exposure.check_class(cls, worker=self.worker)
        state = self._dec(v.get("state"), bufs, depth + 1)
        new: Any = cls.__new__
        obj = new(cls)
        if hasattr(obj, "__setstate__"):
            obj.__setstate__(state)
        elif isinstance(state, dict):
            obj.__dict__.update(state)
        elif state is not None:
            raise SerializationError(f"cannot restore a {cls.__qualname__} from its state")
        return obj

    def _grad(self, out: Any, v: dict[str, Any]) -> Any:
        if "ad" in v and self.on_grad is not None:
            return self.on_grad(out, v["ad"])
        if v.get("requires_grad") is True:
            out.requires_grad_(True)
        return out

    def _rref(self, v: dict[str, Any]) -> Any:
        rref_id, owner = v.get("id"), v.get("owner")
        if not isinstance(rref_id, str) or not isinstance(owner, str) or self.make_rref is None:
            raise SerializationError(f"malformed RRef received by {self.worker}")
        return self.make_rref(rref_id, owner)


def _is_module(v: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(v, torch.nn.Module)


def _buf(bufs: list[Any], v: dict[str, Any]) -> Any:
    index = v.get("b")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(bufs):
        raise SerializationError("a value points at a buffer the message does not have")
    return bufs[index]


def _float(text: Any) -> float:
    if not isinstance(text, str) or len(text) > 40:
        raise SerializationError("malformed float received")
    try:
        return float(text)
    except ValueError:
        raise SerializationError("malformed float received") from None


def _complex(v: dict[str, Any]) -> complex:
    parts = v.get("v")
    if not isinstance(parts, list) or len(parts) != 2:
        raise SerializationError("malformed complex received")
    return complex(_float(parts[0]), _float(parts[1]))


def _tensor(v: dict[str, Any], bufs: list[Any]) -> Any:
    import torch

    dtype, shape, strides = v.get("dtype"), v.get("shape"), v.get("strides")
    if (
        not isinstance(dtype, str)
        or dtype not in TENSOR_DTYPES
        or not isinstance(shape, list)
        or not isinstance(strides, list)
        or not _ints(shape)
        or not _ints(strides)
        or len(shape) != len(strides)
    ):
        raise SerializationError("malformed tensor received (dtype, shape or strides)")
    torch_dtype, itemsize = _dtype(dtype)
    data = _buf(bufs, v)
    if any(s == 0 for s in shape):
        return torch.empty(shape, dtype=torch_dtype)
    needed = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    if needed * itemsize > len(data) or len(data) % itemsize:
        raise SerializationError(f"tensor buffer of {len(data)} bytes is too small for shape {shape}")
    # in place when the frame's memory is ours to keep (a shared-memory frame), else one copy
    owned = data if isinstance(data, memoryview) and not data.readonly else bytearray(data)
    return torch.frombuffer(owned, dtype=torch_dtype).as_strided(shape, strides)


def _ints(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= 64
        and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 48 for x in value)
    )


_SIMPLE: dict[str, Callable[[Decoder, dict[str, Any], list[Any], int], Any]] = {
    "tuple": lambda d, v, b, n: tuple(d._items(v, b, n)),
    "set": lambda d, v, b, n: set(d._items(v, b, n)),
    "frozenset": lambda d, v, b, n: frozenset(d._items(v, b, n)),
    "dict": lambda d, v, b, n: d._dict(v, b, n),
    "bytes": lambda d, v, b, n: bytes(_buf(b, v)),
    "bytearray": lambda d, v, b, n: bytearray(_buf(b, v)),
    "float": lambda d, v, b, n: _float(v.get("v")),
    "complex": lambda d, v, b, n: _complex(v),
    "tensor": lambda d, v, b, n: d._grad(_tensor(v, b), v),
    "rref": lambda d, v, b, n: d._rref(v),
    "fn": lambda d, v, b, n: d.exposure.resolve(str(v.get("path")), worker=d.worker),
    "obj": lambda d, v, b, n: d._object(v, b, n),
}


def dumps_tree(tree: Any) -> bytes:
    """The tree as compact JSON (UTF-8)."""
    return json.dumps(tree, separators=(",", ":"), allow_nan=False).encode()


def loads_tree(data: bytes | memoryview) -> Any:
    """Parse a received JSON tree; malformed or too deeply nested input is a :class:`SerializationError`."""
    try:
        return json.loads(bytes(data))
    except (ValueError, RecursionError) as exc:
        raise SerializationError(f"malformed message header: {type(exc).__name__}") from None
