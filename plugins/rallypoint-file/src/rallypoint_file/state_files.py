"""Reading and writing the file backend's state files: one JSON record per key, change tokens.

A key's file holds ``{"v": <revision>, "value": <JSON value>}`` and is replaced whole
(:func:`atomic_write`: a temporary file, then ``os.replace``), so readers never take the lock and
never see half a file. After the data, :func:`publish` moves the change token of the key's
directory (see :mod:`rallypoint_file.watching`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from rallypoint.rendezvous.backend import Entry
from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError
from rallypoint_file.layout import REV_WIDTH, TOKEN, read_bytes
from rallypoint_file.trust import Trust

__all__ = ["atomic_write", "publish", "read_json", "read_record"]


def read_json(path: str, root: Path) -> Any:
    """The JSON content of ``path``, or ``None`` when it does not exist.

    Raises:
        RendezvousStateError: it cannot be read or is not JSON (the message names the file and
            the run directory ``root`` to delete).
    """
    try:
        text = read_bytes(path).decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise RendezvousStateError(f"cannot read rendezvous state file {path}: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RendezvousStateError(
            f"rendezvous state file {path} is corrupt (not JSON: {exc}); delete the run directory "
            f"{root} or use a new run_id"
        ) from exc


def read_record(path: str, root: Path) -> Entry | None:
    """The entry a key's file holds, or ``None`` when the key has none.

    Raises:
        RendezvousStateError: the file is not a record of ours (see :func:`read_json` too).
    """
    data = read_json(path, root)
    if data is None:
        return None
    if not isinstance(data, dict) or set(data) != {"v", "value"} or not isinstance(data["v"], int):
        raise RendezvousStateError(
            f"rendezvous state file {path} is not a rallypoint-file record (found {str(data)[:200]!r}); "
            f"delete the run directory {root} or use a new run_id"
        )
    return Entry(data["value"], data["v"])


def atomic_write(path: str, text: str, trust: Trust) -> None:
    """Replace ``path`` with ``text`` whole (created with the mode and group ``trust`` asks for).

    Raises:
        RendezvousBackendError: it cannot be written (the temporary file is removed).
    """
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, trust.file_mode)
        try:
            trust.fix_file(fd)
            data = text.encode("utf-8")
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise RendezvousBackendError(f"cannot write rendezvous state file {path}: {exc}") from exc


def publish(directory: str, rev: int, trust: Trust) -> None:
    """Move the change token of ``directory`` to ``rev`` (after the data is in place).

    Rewritten in place: a reader racing with this write may read a mix of old and new
    bytes, which only looks like a change (a harmless extra look); the next poll reads the
    final value, so no change is missed.
    """
    path = os.path.join(directory, TOKEN)
    text = f"{rev:>{REV_WIDTH}d}"
    try:
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:
            # The first token of a directory is created whole, so that a process killed
            # here never leaves an empty token behind.
            atomic_write(path, text, trust)
            return
        try:
            os.pwrite(fd, text.encode(), 0)
        finally:
            os.close(fd)
    except OSError as exc:
        raise RendezvousBackendError(f"cannot write rendezvous change token in {directory}: {exc}") from exc
