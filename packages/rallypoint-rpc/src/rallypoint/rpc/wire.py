"""The frame every transport carries: a JSON header and raw buffers, in one byte string.

Layout (little endian): ``b"RPR1"``, the header length (u32), the number of buffers (u32), each
buffer's length (u64), then the header and the buffers back to back. :func:`unpack` checks every
length against the frame before slicing (zero-copy views), so a truncated or lying frame is a
:class:`~rallypoint.rpc.errors.SerializationError`, never a crash.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from rallypoint.rpc.errors import SerializationError

__all__ = ["MAGIC", "MAX_BUFFERS", "MAX_HEADER", "pack", "unpack"]

MAGIC = b"RPR1"
#: Largest header a frame may have (the JSON tree of a message).
MAX_HEADER = 64 << 20
#: Most buffers one frame may carry.
MAX_BUFFERS = 1 << 16
_FIXED = struct.Struct("<4sII")


def pack(header: bytes, buffers: Sequence[Any] = ()) -> bytes:
    """One frame of ``header`` and ``buffers`` (bytes-like objects; copied once, here)."""
    views = [memoryview(b).cast("B") for b in buffers]
    lengths = struct.pack(f"<{len(views)}Q", *(v.nbytes for v in views))
    return b"".join([_FIXED.pack(MAGIC, len(header), len(views)), lengths, header, *views])


def unpack(frame: bytes | memoryview) -> tuple[memoryview, list[memoryview]]:
    """Split a frame into its header and buffers (views into ``frame``)."""
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
    if at + header_len + sum(lengths) != view.nbytes:
        raise SerializationError("frame lengths do not add up to its size")
    header = view[at : at + header_len]
    at += header_len
    buffers = []
    for n in lengths:
        buffers.append(view[at : at + n])
        at += n
    return header, buffers
