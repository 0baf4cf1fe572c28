"""The same-host fast path of the ``grpc`` RPC transport: large frames through shared memory.

gRPC moves a megabyte in several milliseconds even on loopback; a file in ``/dev/shm`` (memory)
is written and read back in a fraction of that. So between two workers of one host, a frame of
:data:`THRESHOLD` bytes or more is written to a fresh file there and the gRPC message carries
only its name (:data:`REF_MAGIC` + name); the receiver reads the file and unlinks it.

Who shares a host is found out, not assumed: each transport creates a marker file of its own
(random name) and sends the name with every call and reply; a peer that can see that file (same
``/dev/shm``, same user) is on this host. A name received is only ever one of ours: it must match
:data:`NAME_RE`, is opened without following links, and must be a regular file of this user no
larger than the message limit. Files are created ``0600``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import stat
import threading
import weakref
from pathlib import Path
from typing import Any

__all__ = ["METADATA_KEY", "NAME_RE", "REF_MAGIC", "THRESHOLD", "SharedMemoryPath"]

#: Frames at least this large travel through shared memory between workers of one host.
THRESHOLD = 64 << 10
#: A gRPC message that names a shared-memory frame starts with this.
REF_MAGIC = b"RPSHM1:"
#: Call and reply metadata that carries the sender's marker name.
METADATA_KEY = "x-rallypoint-rpc-shm"
#: The only file names a reference may carry.
NAME_RE = re.compile(r"^rallypoint-rpc-[0-9a-f]{32}(-p[0-9]{1,10}\.marker)?$")
_DIR = Path("/dev/shm")
_IOV_MAX = 1024


class SharedMemoryPath:
    """One transport's side of the fast path: its marker, the files it made, the peers it saw."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.marker = f"rallypoint-rpc-{secrets.token_hex(16)}-p{os.getpid()}.marker"
        _sweep_markers(directory)
        self._lock = threading.Lock()
        self._made: set[str] = set()
        self._visible: dict[str, bool] = {}
        self._write(self.marker, [])
        # the marker goes with the process even when close() is never called
        self._finalizer = weakref.finalize(self, _unlink, directory / self.marker)

    @classmethod
    def create(cls, max_bytes: int, directory: Path = _DIR) -> SharedMemoryPath | None:
        """The fast path, or ``None`` where there is no usable ``/dev/shm``."""
        try:
            return cls(directory, max_bytes) if directory.is_dir() else None
        except OSError:
            return None

    def _write(self, name: str, parts: list[Any]) -> None:
        path = self.directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            views = [v for v in (memoryview(p).cast("B") for p in parts) if v.nbytes]
            while views:
                written = os.writev(fd, views[:_IOV_MAX])
                while views and written >= views[0].nbytes:
                    written -= views.pop(0).nbytes
                if written:
                    views[0] = views[0][written:]
        finally:
            os.close(fd)
        with self._lock:
            self._made.add(name)

    def visible(self, marker: str | None) -> bool:
        """Whether the peer whose marker is ``marker`` shares this host (and user)."""
        if not marker or not NAME_RE.match(marker) or not marker.endswith(".marker"):
            return False
        with self._lock:
            known = self._visible.get(marker)
        if known is None:
            try:
                st = os.stat(self.directory / marker, follow_symlinks=False)
                known = stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
            except OSError:
                known = False
            with self._lock:
                self._visible[marker] = known
        return known

    def put(self, parts: list[Any]) -> tuple[bytes, str]:
        """Write a frame (its parts) to a new file; returns the message that names it, and the name."""
        name = f"rallypoint-rpc-{secrets.token_hex(16)}"
        self._write(name, parts)
        return REF_MAGIC + name.encode(), name

    def take(self, message: bytes) -> memoryview:
        """The frame a reference message names, mapped in place (the file is removed at once).

        The view is writable (a private mapping): tensors decoded from it use it without a copy.

        Raises:
            ValueError: not a valid name, not a regular file of this user, too large, or gone.
        """
        name = bytes(message[len(REF_MAGIC) :]).decode("ascii", "replace")
        if not NAME_RE.match(name) or name.endswith(".marker"):
            raise ValueError("invalid shared-memory frame name")
        try:
            fd = os.open(self.directory / name, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise ValueError(f"shared-memory frame {name} cannot be opened: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > self.max_bytes:
                raise ValueError(f"shared-memory frame {name} is not a frame of this user within the size limit")
            if st.st_size == 0:
                raise ValueError(f"shared-memory frame {name} is empty")
            mapped = mmap.mmap(fd, st.st_size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
            self.discard(name)
        return memoryview(mapped)

    def discard(self, name: str) -> None:
        """Remove a frame file if it is still there."""
        with contextlib.suppress(OSError):
            os.unlink(self.directory / name)
        with self._lock:
            self._made.discard(name)

    def close(self) -> None:
        """Remove the marker and every frame this side made that nobody took."""
        with self._lock:
            names = list(self._made)
        for name in names:
            self.discard(name)
        self._finalizer()


def _sweep_markers(directory: Path) -> None:
    """Remove the markers of this user's processes that are gone (killed before they could)."""
    for path in directory.glob("rallypoint-rpc-*-p*.marker"):
        if not NAME_RE.match(path.name):
            continue
        pid = int(path.name.rsplit("-p", 1)[1].removesuffix(".marker"))
        if not process_gone(pid):
            continue  # alive (or not ours to signal: leave it)
        with contextlib.suppress(OSError):
            if path.lstat().st_uid == os.getuid():
                path.unlink()


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` exists (``False`` when it runs, or when we may not signal it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
