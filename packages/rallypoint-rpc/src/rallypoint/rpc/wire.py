"""The frame every transport carries: a JSON header and raw buffers, in one byte string.

Layout (little endian): ``b"RPR1"``, the header length (u32), the number of buffers (u32), each
buffer's length (u64), then the header and the buffers, each non-empty buffer starting at a
multiple of :data:`ALIGN` bytes from the frame's start (zero padding before it), so that a tensor
can be used in place where the frame's memory allows. :func:`unpack` checks every
length against the frame before slicing (zero-copy views), so a truncated or lying frame is a
:class:`~rallypoint.rpc.errors.SerializationError`, never a crash.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from rallypoint.rpc.errors import SerializationError

__all__ = ["ALIGN", "MAGIC", "MAX_BUFFERS", "MAX_HEADER", "frame_size", "pack", "pack_parts", "unpack"]

MAGIC = b"RPR1"
#: Largest header a frame may have (the JSON tree of a message).
MAX_HEADER = 64 << 20
#: Most buffers one frame may carry.
MAX_BUFFERS = 1 << 16
#: Every non-empty buffer starts at a multiple of this many bytes from the frame's start.
ALIGN = 64
_FIXED = struct.Struct("<4sII")
_ZEROS = bytes(ALIGN)


def _aligned(at: int) -> int:
    return (at + ALIGN - 1) // ALIGN * ALIGN


def pack_parts(header: bytes, buffers: Sequence[Any] = ()) -> list[Any]:
    """The pieces of one frame, in order, without copying the buffers (their concatenation is the frame)."""
    views = [memoryview(b).cast("B") for b in buffers]
    lengths = struct.pack(f"<{len(views)}Q", *(v.nbytes for v in views))
    parts: list[Any] = [_FIXED.pack(MAGIC, len(header), len(views)), lengths, header]
    at = _FIXED.size + len(lengths) + len(header)
    for v in views:
        pad = _aligned(at) - at if v.nbytes else 0
        if pad:
            parts.append(_ZEROS[:pad])
        parts.append(v)
        at += pad + v.nbytes
    return parts


def pack(header: bytes, buffers: Sequence[Any] = ()) -> bytes:
    """One frame of ``header`` and ``buffers`` (bytes-like objects; copied once, here)."""
    return b"".join(pack_parts(header, buffers))


def frame_size(parts: Sequence[Any]) -> int:
    """The size of the frame that ``parts`` make up."""
    return sum(memoryview(p).nbytes for p in parts)


def unpack(frame: Any) -> tuple[memoryview, list[memoryview]]:
    """Split a frame (any bytes-like object) into its header and buffers: views into ``frame``.

    Buffers are writable views when ``frame`` is writable (a tensor can then use them in place).
    """
    view = memoryview(frame).cast("B")
    if view.nbytes < _FIXED.size:
        raise SerializationError(f"frame of {view.nbytes} bytes is shorter than its fixed header")
    magic, header_len, count = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise SerializationError("not a rallypoint RPC frame (bad magic)")
    if header_len > MAX_HEADER or count > MAX_BUFFERS:
        raise SerializationError(f"frame announces a {header_len}-byte header and {count} buffers: too large")
    at = _FIXED.size + 8 * count
    if view.nbytes < at + header_len:
        raise SerializationError("truncated frame")
    lengths = struct.unpack_from(f"<{count}Q", view, _FIXED.size)
    header = view[at : at + header_len]
    at += header_len
    buffers = []
    for n in lengths:
        at = _aligned(at) if n else at
        if at + n > view.nbytes:
            raise SerializationError("frame lengths do not add up to its size")
        buffers.append(view[at : at + n])
        at += n
    if at != view.nbytes:
        raise SerializationError("frame lengths do not add up to its size")
    return header, buffers
