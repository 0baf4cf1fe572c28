"""Reading a worker's collective flight record (written by :mod:`rallypoint.agent.debug_hooks`)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

__all__ = ["read_flight"]

# the layout of debug_hooks.py (which the agent does not import: it is the workers' file)
_SLOT = struct.Struct("<qdd16s16s24sq6q")
_HEADER = struct.Struct("<q")
_HEADER_SIZE = 64


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def read_flight(path: Path) -> list[dict[str, Any]]:
    """The records of a flight file, oldest first; ``[]`` when there is none (not a Python worker).

    Each record: ``seq`` (per group), ``op``, ``dtype``, ``shape`` (list), ``group``, ``start``
    (epoch seconds), ``end`` (epoch seconds; ``None`` while it runs; ``"async"`` when it returned a
    work handle), ``duration`` (seconds, or ``None``).
    """
    try:
        data = path.read_bytes()
    except OSError:
        return []
    if len(data) < _HEADER_SIZE:
        return []
    (count,) = _HEADER.unpack_from(data, 0)
    slots = (len(data) - _HEADER_SIZE) // _SLOT.size
    if slots <= 0 or count <= 0:
        return []
    records = []
    for n in range(max(0, count - slots), count):
        seq, start, end, op, dtype, group, ndim, *dims = _SLOT.unpack_from(
            data, _HEADER_SIZE + (n % slots) * _SLOT.size
        )
        done: float | str | None = None if end == 0.0 else ("async" if end < 0 else end)
        records.append(
            {
                "seq": seq,
                "op": _text(op),
                "dtype": _text(dtype),
                "shape": list(dims[: max(0, min(ndim, 6))]),
                "group": _text(group),
                "start": start,
                "end": done,
                "duration": end - start if isinstance(done, float) else None,
            }
        )
    return records
