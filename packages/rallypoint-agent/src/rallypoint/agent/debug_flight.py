"""Reading a worker's collective flight record (written by :mod:`rallypoint.agent.debug_hooks`).

:func:`read_flight` reads every record (for a report); :class:`FlightMark` reads only how far
the record got (two short reads), for a check that runs every monitor interval.
"""

from __future__ import annotations

import contextlib
import os
import struct
from pathlib import Path
from typing import Any

__all__ = ["P2P_OPS", "SEND_OPS", "FlightMark", "nbytes", "read_flight"]

# the layout of debug_hooks.py (which the agent does not import: it is the workers' file)
_SLOT = struct.Struct("<qdd16s16s24sq6qqq")
#: The point-to-point ops: their records carry a peer (global rank, -1 for any) and a tag.
P2P_OPS = frozenset({"isend", "irecv", "send", "recv"})
#: Sending ops (the others of P2P_OPS receive).
SEND_OPS = frozenset({"isend", "send"})
_HEADER = struct.Struct("<qq")  # records ever written, asynchronous calls ever completed
_HEADER_SIZE = 64
#: Where a record's end time is, from the start of its slot (after ``seq`` and ``start``).
_END_OFFSET = 16
_END = struct.Struct("<d")


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def nbytes(dtype: str, shape: list[int], ndim: int) -> int | None:
    """The bytes of a tensor of ``dtype`` (torch's name, ``float32``) and ``shape``; ``None`` when not known.

    The element size comes from the name (``int32``: 4, ``bfloat16``: 2, ``bool`` and ``float8_*``: 1);
    a shape of more than the 6 dims a record keeps, or a dtype without a size in its name, gives ``None``.
    """
    if ndim > len(shape) or not dtype:
        return None
    if dtype == "bool" or dtype.startswith("float8"):
        size = 1
    else:
        digits = len(dtype) - len(dtype.rstrip("0123456789"))
        if digits == 0:
            return None
        size = int(dtype[-digits:]) // 8
        if size == 0:  # a packed type (quint4x2)
            return None
    total = size
    for d in shape:
        total *= d
    return total


def read_flight(path: Path) -> list[dict[str, Any]]:
    """The records of a flight file, oldest first; ``[]`` when there is none (not a Python worker).

    Each record: ``seq`` (per group), ``op``, ``dtype``, ``shape`` (list), ``group``, ``start``
    (epoch seconds), ``end`` (epoch seconds; ``None`` until it completes, a call started with
    ``async_op=True`` included; ``"async"`` when it returned a work handle whose completion cannot
    be seen), ``duration`` (seconds, or ``None``), ``bytes`` (the tensor's size, ``None`` when
    not known, see :func:`nbytes`), and for a point-to-point call (op in :data:`P2P_OPS`) ``peer``
    (the other side's global rank, ``-1`` for a receive from any rank) and ``tag`` (``None`` both for
    a collective). A point-to-point call's ``seq`` counts per group, direction and peer.
    """
    try:
        data = path.read_bytes()
    except OSError:
        return []
    if len(data) < _HEADER_SIZE:
        return []
    count, _ = _HEADER.unpack_from(data, 0)
    slots = (len(data) - _HEADER_SIZE) // _SLOT.size
    if slots <= 0 or count <= 0:
        return []
    records = []
    for n in range(max(0, count - slots), count):
        seq, start, end, op, dtype, group, ndim, *dims, peer, tag = _SLOT.unpack_from(
            data, _HEADER_SIZE + (n % slots) * _SLOT.size
        )
        done: float | str | None = None if end == 0.0 else ("async" if end < 0 else end)
        name, kind, shape = _text(op), _text(dtype), list(dims[: max(0, min(ndim, 6))])
        p2p = name in P2P_OPS
        records.append(
            {
                "seq": seq,
                "op": name,
                "dtype": kind,
                "shape": shape,
                "bytes": nbytes(kind, shape, ndim),
                "group": _text(group),
                "peer": peer if p2p else None,
                "tag": tag if p2p else None,
                "start": start,
                "end": done,
                "duration": end - start if isinstance(done, float) else None,
            }
        )
    return records


class FlightMark:
    """How far one worker's flight record got: records written, asynchronous calls completed, last end.

    The triple changes when the worker starts a collective, when its last one completes (or
    returns a work handle whose end is not seen) and when any asynchronous one completes, so an
    unchanged triple means no collective progress. Each :meth:`read` is two ``pread`` calls (the
    header's 16 bytes, the last slot's end time) on a descriptor kept open (the file is mapped
    by the worker and may be re-created by a later round: the descriptor follows the inode, and a
    short read is taken as "nothing yet"); no file is read whole.

    Args:
        path: the worker's ``rank_<R>.flight`` file (it may not exist yet).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._slots = 0

    def _open(self) -> int | None:
        if self._fd is not None:
            return self._fd
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        slots = (os.fstat(fd).st_size - _HEADER_SIZE) // _SLOT.size
        if slots <= 0:  # created, not sized yet
            os.close(fd)
            return None
        self._fd, self._slots = fd, slots
        return fd

    def read(self) -> tuple[int, int, float]:
        """``(records written, asynchronous calls completed, end time of the last record)``; zeros before the first."""
        fd = self._open()
        if fd is None:
            return 0, 0, 0.0
        try:
            head = os.pread(fd, _HEADER.size, 0)
            count, done = _HEADER.unpack(head) if len(head) == _HEADER.size else (0, 0)
            if count <= 0:
                return 0, 0, 0.0
            raw = os.pread(fd, _END.size, _HEADER_SIZE + ((count - 1) % self._slots) * _SLOT.size + _END_OFFSET)
        except OSError:
            return 0, 0, 0.0
        return count, done, _END.unpack(raw)[0] if len(raw) == _END.size else 0.0

    def close(self) -> None:
        """Close the descriptor (a later :meth:`read` opens the file again)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
