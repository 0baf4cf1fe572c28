"""A rendezvous backend on a (shared) file system.

Layout of ``<path>/<run_id>/``::

    FORMAT          {"format": "rallypoint-file", "version": 2, "run_id": ...}: marks the directory as ours
    lock            fcntl (flock) lock taken by every write; holds the space's revision counter
                    (versions are revisions), rewritten in place under the lock
    kv/<first segment>/<rest of key, percent-encoded>   (keys without '/': kv/@root/<key>)
                    one JSON file per key: {"v": <revision>, "value": <JSON value>}
    kv/<first segment>/.rev
                    change token of that directory: the revision of its last write

A write takes the lock, bumps the counter, replaces the key's file atomically (write a temporary
file, then ``os.replace``), so readers never take the lock and never see half a file, and then
publishes the revision in the key's directory token (after the data: a watcher that sees the
new token also sees the change). Watches poll with a short exponential backoff, 0.5 ms up to
``poll_interval``: a key watch reads the key's file; a prefix watch reads only the token of the
prefix's first segment (``round/`` wakes for ``round/...`` writes, not for heartbeats or join
records) and lists the prefix only when that token moved. Works between processes and hosts that
share the directory (local disk, NFS with close-to-open consistency). TTLs are not supported:
expiry would compare clocks of different hosts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rallypoint.rendezvous.backend import Entry, JSONValue, Version, check_key
from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError

__all__ = ["FileBackend", "FileOptions", "create_file_backend"]

FORMAT = {"format": "rallypoint-file", "version": 2}
#: Directory of keys without '/'; percent-encoding never produces a literal '@'.
_ROOT_DIR = "@root"
#: Name of a directory's change token (a dot file: never listed as a key).
_TOKEN = ".rev"
#: Width of the revision counter and change tokens (decimal, space-padded: valid JSON; rewritten in
#: place, so fixed width).
_REV_WIDTH = 20
_PATH_LOCKS: dict[str, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


class FileOptions(BaseModel):
    """``[rendezvous.options]`` of the ``file`` backend.

    Attributes:
        path: a directory every node can reach (a shared file system for several hosts);
            created if missing. Each run id gets a subdirectory.
        poll_interval: the longest pause between two looks at a watched file, in seconds.
    """

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="directory on a file system shared by every node")
    poll_interval: float = Field(default=0.01, gt=0, le=5)


#: What ``urllib.parse.quote(key_part, safe="")`` escapes among the characters keys may hold.
_ESCAPES = tuple((urllib.parse.quote(c, safe=""), c) for c in "/:@+=,")


def _unquote(name: str) -> str:
    """Invert ``quote(name, safe="")`` for key text (fast path: a few ``str.replace``)."""
    if "%" not in name:
        return name
    for escaped, char in _ESCAPES:
        name = name.replace(escaped, char)
    return name if "%" not in name else urllib.parse.unquote(name)


def _path_lock(path: Path) -> threading.Lock:
    with _PATH_LOCKS_GUARD:
        return _PATH_LOCKS.setdefault(str(path), threading.Lock())


def _dump(value: JSONValue) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"rendezvous values must be JSON values, got {type(value).__name__}: {exc}") from exc


class FileBackend:
    """A :class:`~rallypoint.rendezvous.backend.RendezvousBackend` in a directory.

    Args:
        path: the shared directory (the run's data goes to ``path/run_id``).
        run_id: the run id (letters, digits and ``. _ - ~ : @ + = ,``).
        poll_interval: see :class:`FileOptions`.

    Raises:
        RendezvousStateError: the run directory exists but holds foreign or corrupt data.
        RendezvousBackendError: the directory cannot be created or written.
    """

    supports_ttl = False

    def __init__(self, path: str | os.PathLike[str], run_id: str, *, poll_interval: float = 0.01) -> None:
        if not run_id or "/" in run_id:
            raise ValueError(f"invalid run_id {run_id!r} for the file rendezvous backend: no '/' allowed")
        check_key(run_id)
        self.run_id = run_id
        self.root = Path(path) / run_id
        self.kv = self.root / "kv"
        self._kv = str(self.kv)
        self.poll_interval = poll_interval
        try:
            self.kv.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RendezvousBackendError(f"cannot create rendezvous directory {self.kv}: {exc}") from exc
        self._tlock = _path_lock(self.root.resolve())
        self._lock_path = self.root / "lock"
        self._lock_file = str(self._lock_path)
        self._init_format()

    # -- files ---------------------------------------------------------------------------
    def _init_format(self) -> None:
        fmt = self.root / "FORMAT"
        expected = {**FORMAT, "run_id": self.run_id}
        with self._locked():
            if not fmt.exists():
                others = [p.name for p in self.root.iterdir() if p.name not in ("kv", "lock", "FORMAT")]
                if others or any(self.kv.iterdir()):
                    raise RendezvousStateError(
                        f"{self.root} is not a rallypoint rendezvous directory (it has no FORMAT file but holds "
                        f"{sorted(others) or 'files under kv/'}); choose another rendezvous.options.path or run_id"
                    )
                self._atomic_write(str(fmt), json.dumps(expected))
                return
        data = self._read_json(str(fmt))
        if not isinstance(data, dict) or data.get("format") != FORMAT["format"] or data.get("run_id") != self.run_id:
            raise RendezvousStateError(
                f"{fmt} does not describe a rallypoint-file rendezvous of run {self.run_id!r} (found {data!r}); "
                f"choose another rendezvous.options.path or delete the directory"
            )
        if data.get("version") != FORMAT["version"]:
            raise RendezvousStateError(
                f"{fmt} has format version {data.get('version')!r}; this rallypoint-file reads version "
                f"{FORMAT['version']}: upgrade rallypoint-file on every node or use a new run_id"
            )

    def _dir_of(self, key: str) -> str:
        """The directory (under ``kv/``) that holds ``key``'s file."""
        head, sep, _ = key.partition("/")
        return os.path.join(self._kv, urllib.parse.quote(head, safe="") if sep else _ROOT_DIR)

    def _path(self, key: str) -> str:
        head, sep, rest = key.partition("/")
        if not sep:
            return os.path.join(self._kv, _ROOT_DIR, urllib.parse.quote(head, safe=""))
        return os.path.join(self._kv, urllib.parse.quote(head, safe=""), urllib.parse.quote(rest, safe=""))

    def _file(self, key: str) -> Path:
        """The file that holds ``key``."""
        return Path(self._path(key))

    @staticmethod
    def _key_of(directory: str, name: str) -> str:
        head = _unquote(directory)
        rest = _unquote(name)
        return rest if directory == _ROOT_DIR else f"{head}/{rest}"

    @staticmethod
    def _read_bytes(path: str) -> bytes:
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

    def _read_json(self, path: str) -> Any:
        try:
            text = self._read_bytes(path).decode("utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise RendezvousStateError(f"cannot read rendezvous state file {path}: {exc}") from exc
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise RendezvousStateError(
                f"rendezvous state file {path} is corrupt (not JSON: {exc}); delete the run directory "
                f"{self.root} or use a new run_id"
            ) from exc

    def _read(self, path: str) -> Entry | None:
        data = self._read_json(path)
        if data is None:
            return None
        if not isinstance(data, dict) or set(data) != {"v", "value"} or not isinstance(data["v"], int):
            raise RendezvousStateError(
                f"rendezvous state file {path} is not a rallypoint-file record (found {str(data)[:200]!r}); "
                f"delete the run directory {self.root} or use a new run_id"
            )
        return Entry(data["value"], data["v"])

    def _atomic_write(self, path: str, text: str) -> None:
        directory, name = os.path.split(path)
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
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

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        """Hold the write lock; yields the lock file's descriptor (which holds the counter)."""
        with self._tlock:
            try:
                fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise RendezvousBackendError(f"cannot open lock file {self._lock_path}: {exc}") from exc
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX)
                        break
                    except InterruptedError:  # pragma: no cover - retried by Python anyway
                        continue
                    except OSError as exc:
                        if exc.errno == errno.EINTR:  # pragma: no cover
                            continue
                        raise RendezvousBackendError(f"cannot lock {self._lock_path}: {exc}") from exc
                yield fd
            finally:
                os.close(fd)  # releases the lock

    def _next_revision(self, fd: int) -> int:
        """Bump the revision counter (the lock is held on ``fd``) and return the new revision.

        The counter moves before the data is written, so a writer that dies half-way only skips
        a number: no revision is ever given to two writes.
        """
        try:
            raw = os.pread(fd, 64, 0)
            rev = int(raw.strip() or b"0") + 1
            os.pwrite(fd, b"%*d" % (_REV_WIDTH, rev), 0)
        except ValueError:
            raise RendezvousStateError(
                f"rendezvous revision counter in {self._lock_path} is corrupt (found {raw[:64]!r}); "
                f"delete the run directory {self.root} or use a new run_id"
            ) from None
        except OSError as exc:
            raise RendezvousBackendError(f"cannot update the revision counter in {self._lock_path}: {exc}") from exc
        return rev

    def _publish(self, directory: str, rev: int) -> None:
        """Move the change token of ``directory`` to ``rev`` (after the data is in place).

        Rewritten in place: a reader racing with this write may read a mix of old and new
        bytes, which only looks like a change (a harmless extra look); the next poll reads the
        final value, so no change is missed.
        """
        path = os.path.join(directory, _TOKEN)
        text = f"{rev:>{_REV_WIDTH}d}"
        try:
            try:
                fd = os.open(path, os.O_WRONLY)
            except FileNotFoundError:
                # The first token of a directory is created whole, so that a process killed
                # here never leaves an empty token behind.
                self._atomic_write(path, text)
                return
            try:
                os.pwrite(fd, text.encode(), 0)
            finally:
                os.close(fd)
        except OSError as exc:
            raise RendezvousBackendError(f"cannot write rendezvous change token in {directory}: {exc}") from exc

    def _put(self, fd: int, key: str, value_text: str) -> int:
        rev = self._next_revision(fd)
        path = self._path(key)
        directory = os.path.dirname(path)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)
        self._atomic_write(path, f'{{"v":{rev},"value":{value_text}}}')
        self._publish(directory, rev)
        return rev

    # -- protocol ------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """See :meth:`RendezvousBackend.get`."""
        return self._read(self._path(check_key(key)))

    def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
        """See :meth:`RendezvousBackend.set`."""
        self._no_ttl(ttl)
        check_key(key)
        text = _dump(value)
        with self._locked() as fd:
            return self._put(fd, key, text)

    def compare_and_set(
        self, key: str, value: JSONValue, *, version: Version | None, ttl: float | None = None
    ) -> tuple[bool, Entry | None]:
        """See :meth:`RendezvousBackend.compare_and_set`."""
        self._no_ttl(ttl)
        check_key(key)
        text = _dump(value)
        with self._locked() as fd:
            current = self._read(self._path(key))
            if (None if current is None else current.version) != version:
                return False, current
            rev = self._put(fd, key, text)
            return True, Entry(json.loads(text), rev)

    def add(self, key: str, amount: int = 1) -> int:
        """See :meth:`RendezvousBackend.add`."""
        check_key(key)
        with self._locked() as fd:
            current = self._read(self._path(key))
            base = 0 if current is None else current.value
            if not isinstance(base, int) or isinstance(base, bool):
                raise TypeError(f"rendezvous key {key!r} holds {base!r}, not an integer; cannot add to it")
            total = base + int(amount)
            self._put(fd, key, str(total))
            return total

    def delete(self, key: str, *, version: Version | None = None) -> bool:
        """See :meth:`RendezvousBackend.delete`."""
        path = self._path(check_key(key))
        with self._locked() as fd:
            current = self._read(path)
            if current is None or (version is not None and current.version != version):
                return False
            rev = self._next_revision(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            self._publish(os.path.dirname(path), rev)
            return True

    def list(self, prefix: str) -> dict[str, Entry]:
        """See :meth:`RendezvousBackend.list`."""
        check_key(prefix, prefix=True)
        head, sep, _ = prefix.partition("/")
        if sep:
            dirs = [urllib.parse.quote(head, safe="")]
        else:
            try:
                dirs = [d for d in os.listdir(self._kv) if not d.startswith(".")]
            except FileNotFoundError:
                return {}
        out: dict[str, Entry] = {}
        for d in dirs:
            directory = os.path.join(self._kv, d)
            try:
                names = os.listdir(directory)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                if name.startswith("."):
                    continue
                key = self._key_of(d, name)
                if key.startswith(prefix):
                    entry = self._read(os.path.join(directory, name))
                    if entry is not None:
                        out[key] = entry
        return out

    def _poll(self, changed: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        pause = 0.0005
        while True:
            if changed():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(pause, remaining))
            pause = min(pause * 1.5, self.poll_interval)

    def watch(self, key: str, *, version: Version | None, timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch` (polls the key's file)."""
        path = self._path(check_key(key))

        def changed() -> bool:
            entry = self._read(path)
            return (None if entry is None else entry.version) != version

        return self._poll(changed, timeout)

    def _token_paths(self, prefix: str) -> tuple[str, ...]:
        """The change tokens that move on every write under ``prefix``."""
        head, sep, _ = prefix.partition("/")
        if sep:
            return (os.path.join(self._kv, urllib.parse.quote(head, safe=""), _TOKEN),)
        try:  # no '/': the prefix may match keys of any directory (rare; the handler never does this)
            dirs = sorted(d for d in os.listdir(self._kv) if not d.startswith("."))
        except FileNotFoundError:
            dirs = []
        return tuple(os.path.join(self._kv, d, _TOKEN) for d in dirs)

    def _token(self, path: str) -> bytes | None:
        """A change token's bytes (``None`` while its directory has never been written)."""
        try:
            return self._read_bytes(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RendezvousStateError(f"cannot read rendezvous change token {path}: {exc}") from exc

    def watch_prefix(self, prefix: str, *, versions: Mapping[str, Version], timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch_prefix`.

        Polls the change token of the prefix's directory (writes elsewhere do not wake it) and
        lists the prefix only when the token moved.
        """
        check_key(prefix, prefix=True)
        known = dict(versions)
        seen: list[Any] = [object()]

        def changed() -> bool:
            paths = self._token_paths(prefix)
            tokens = (paths, tuple(self._token(p) for p in paths))
            if tokens == seen[0]:
                return False
            # Read before listing: a token published after this read is seen by the next poll.
            seen[0] = tokens
            return {k: e.version for k, e in self.list(prefix).items()} != known

        return self._poll(changed, timeout)

    def close(self) -> None:
        """Nothing is held open between calls."""

    @staticmethod
    def _no_ttl(ttl: float | None) -> None:
        if ttl is not None:
            raise NotImplementedError(
                "the file rendezvous backend does not support TTLs (expiry would compare clocks of different hosts)"
            )


def create_file_backend(run_id: str, options: Any) -> FileBackend:
    """Factory of the ``file`` backend record: ``(run_id, options) -> backend``."""
    opts = options if isinstance(options, FileOptions) else FileOptions.model_validate(dict(options or {}))
    return FileBackend(opts.path, run_id, poll_interval=opts.poll_interval)
