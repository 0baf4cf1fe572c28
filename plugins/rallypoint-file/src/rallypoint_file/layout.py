"""The on-disk layout of the file backend: names, key paths, the lock file's format.

See :mod:`rallypoint_file.backend` for the layout of a run directory.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from rallypoint.rendezvous.backend import JSONValue

__all__ = [
    "FORMAT",
    "LOCK_RE",
    "LOCK_SIZE",
    "REV_WIDTH",
    "ROOT_DIR",
    "TOKEN",
    "RunPaths",
    "dump_json",
    "key_of",
    "key_path",
    "path_lock",
    "quote",
    "read_bytes",
    "unquote",
]

FORMAT = {"format": "rallypoint-file", "version": 3}
#: Directory of keys without '/'; percent-encoding never produces a literal '@'.
ROOT_DIR = "@root"
#: Name of a directory's change token (a dot file: never listed as a key).
TOKEN = ".rev"
#: Width of the revision counter and change tokens (decimal, space-padded: valid JSON; rewritten in
#: place, so fixed width).
REV_WIDTH = 20
#: The lock file: the counter, a space, and the run directory's nonce (32 hex digits, written with
#: FORMAT): a run directory deleted and made again has another nonce, even on a reused inode.
LOCK_RE = re.compile(rb"( *[0-9]+) ([0-9a-f]{32})")
LOCK_SIZE = REV_WIDTH + 33
_PATH_LOCKS: dict[str, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


@dataclass(frozen=True)
class RunPaths:
    """Where one run's files are: the run directory ``base/run_id`` and what it holds.

    Attributes:
        base: the shared directory (``rendezvous.options.path``).
        run_id: the run id.
        root: the run directory.
        kv: the directory of the keys.
        lock: the lock file (the revision counter and the run directory's nonce).
        format: the ``FORMAT`` file.
    """

    base: Path
    run_id: str
    root: Path
    kv: Path
    lock: Path
    format: Path

    @classmethod
    def of(cls, base: Path, run_id: str) -> RunPaths:
        """The paths of run ``run_id`` under ``base``."""
        root = base / run_id
        return cls(base, run_id, root, root / "kv", root / "lock", root / "FORMAT")


#: What ``urllib.parse.quote(key_part, safe="")`` escapes among the characters keys may hold.
_ESCAPES = tuple((urllib.parse.quote(c, safe=""), c) for c in "/:@+=,")


def unquote(name: str) -> str:
    """Invert ``quote(name, safe="")`` for key text (fast path: a few ``str.replace``)."""
    if "%" not in name:
        return name
    for escaped, char in _ESCAPES:
        name = name.replace(escaped, char)
    return name if "%" not in name else urllib.parse.unquote(name)


def quote(part: str) -> str:
    """A key segment as a file name (percent-encoded, ``/`` included)."""
    return urllib.parse.quote(part, safe="")


def key_path(kv: str, key: str) -> str:
    """The file under the ``kv`` directory that holds ``key``."""
    head, sep, rest = key.partition("/")
    if not sep:
        return os.path.join(kv, ROOT_DIR, quote(head))
    return os.path.join(kv, quote(head), quote(rest))


def key_of(directory: str, name: str) -> str:
    """The key of the file ``name`` in the ``kv`` subdirectory ``directory`` (inverse of :func:`key_path`)."""
    head = unquote(directory)
    rest = unquote(name)
    return rest if directory == ROOT_DIR else f"{head}/{rest}"


def read_bytes(path: str) -> bytes:
    """The content of ``path`` (one open, read and close; raises ``FileNotFoundError``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def path_lock(path: Path) -> threading.Lock:
    """The in-process lock of a run directory (threads of one process share one flock)."""
    with _PATH_LOCKS_GUARD:
        return _PATH_LOCKS.setdefault(str(path), threading.Lock())


def dump_json(value: JSONValue) -> str:
    """``value`` as compact JSON text; ``TypeError`` for what is not a JSON value."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"rendezvous values must be JSON values, got {type(value).__name__}: {exc}") from exc
