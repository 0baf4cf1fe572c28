"""A rendezvous backend on a (shared) file system.

Layout of ``<path>/<run_id>/``::

    FORMAT          {"format": "rallypoint-file", "version": 1, "run_id": ...}: marks the directory as ours
    lock            fcntl (flock) lock taken by every write
    rev             the space's revision counter, bumped by every write (versions are revisions)
    kv/<first segment>/<rest of key, percent-encoded>   (keys without '/': kv/@root/<key>)
                    one JSON file per key: {"v": <revision>, "value": <JSON value>}

Writes take the lock, bump ``rev`` and replace the key's file atomically (write a temporary file,
then ``os.replace``), so readers never take the lock and never see half a file. Watches poll
(the key's file, or ``rev`` for a prefix) with a short exponential backoff, 0.5 ms up to
``poll_interval``. Works between processes and hosts that share the directory (local disk,
NFS with close-to-open consistency). TTLs are not supported: expiry would compare clocks of
different hosts.
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

FORMAT = {"format": "rallypoint-file", "version": 1}
#: Directory of keys without '/'; percent-encoding never produces a literal '@'.
_ROOT_DIR = "@root"
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
        self.poll_interval = poll_interval
        try:
            self.kv.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RendezvousBackendError(f"cannot create rendezvous directory {self.kv}: {exc}") from exc
        self._tlock = _path_lock(self.root.resolve())
        self._lock_path = self.root / "lock"
        self._rev_path = self.root / "rev"
        self._init_format()

    # -- files ---------------------------------------------------------------------------
    def _init_format(self) -> None:
        fmt = self.root / "FORMAT"
        expected = {**FORMAT, "run_id": self.run_id}
        with self._locked():
            if not fmt.exists():
                others = [p.name for p in self.root.iterdir() if p.name not in ("kv", "lock", "rev", "FORMAT")]
                if others or any(self.kv.iterdir()):
                    raise RendezvousStateError(
                        f"{self.root} is not a rallypoint rendezvous directory (it has no FORMAT file but holds "
                        f"{sorted(others) or 'files under kv/'}); choose another rendezvous.options.path or run_id"
                    )
                self._atomic_write(fmt, json.dumps(expected))
                return
        data = self._read_json(fmt)
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

    def _file(self, key: str) -> Path:
        head, sep, rest = key.partition("/")
        if not sep:
            return self.kv / _ROOT_DIR / urllib.parse.quote(head, safe="")
        return self.kv / urllib.parse.quote(head, safe="") / urllib.parse.quote(rest, safe="")

    def _key_of(self, directory: str, name: str) -> str:
        head = urllib.parse.unquote(directory)
        rest = urllib.parse.unquote(name)
        return rest if directory == _ROOT_DIR else f"{head}/{rest}"

    def _read_json(self, path: Path) -> Any:
        try:
            text = path.read_text(encoding="utf-8")
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

    def _read(self, path: Path) -> Entry | None:
        data = self._read_json(path)
        if data is None:
            return None
        if not isinstance(data, dict) or set(data) != {"v", "value"} or not isinstance(data["v"], int):
            raise RendezvousStateError(
                f"rendezvous state file {path} is not a rallypoint-file record (found {str(data)[:200]!r}); "
                f"delete the run directory {self.root} or use a new run_id"
            )
        return Entry(data["value"], data["v"])

    def _atomic_write(self, path: Path, text: str) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise RendezvousBackendError(f"cannot write rendezvous state file {path}: {exc}") from exc

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._tlock:
            try:
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
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
                yield
            finally:
                os.close(fd)  # releases the lock

    def _revision(self) -> int:
        raw = self._read_json(self._rev_path)
        if raw is None:
            return 0
        if not isinstance(raw, int):
            raise RendezvousStateError(f"rendezvous revision file {self._rev_path} is corrupt (found {raw!r})")
        return raw

    def _publish(self, rev: int) -> None:
        # Written after the data: a watcher that sees the new revision also sees the change.
        self._atomic_write(self._rev_path, str(rev))

    def _put(self, key: str, value_text: str) -> int:
        rev = self._revision() + 1
        path = self._file(key)
        path.parent.mkdir(exist_ok=True)
        self._atomic_write(path, f'{{"v":{rev},"value":{value_text}}}')
        self._publish(rev)
        return rev

    # -- protocol ------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """See :meth:`RendezvousBackend.get`."""
        return self._read(self._file(check_key(key)))

    def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
        """See :meth:`RendezvousBackend.set`."""
        self._no_ttl(ttl)
        check_key(key)
        text = _dump(value)
        with self._locked():
            return self._put(key, text)

    def compare_and_set(
        self, key: str, value: JSONValue, *, version: Version | None, ttl: float | None = None
    ) -> tuple[bool, Entry | None]:
        """See :meth:`RendezvousBackend.compare_and_set`."""
        self._no_ttl(ttl)
        check_key(key)
        text = _dump(value)
        with self._locked():
            current = self._read(self._file(key))
            if (None if current is None else current.version) != version:
                return False, current
            rev = self._put(key, text)
            return True, Entry(json.loads(text), rev)

    def add(self, key: str, amount: int = 1) -> int:
        """See :meth:`RendezvousBackend.add`."""
        check_key(key)
        with self._locked():
            current = self._read(self._file(key))
            base = 0 if current is None else current.value
            if not isinstance(base, int) or isinstance(base, bool):
                raise TypeError(f"rendezvous key {key!r} holds {base!r}, not an integer; cannot add to it")
            total = base + int(amount)
            self._put(key, str(total))
            return total

    def delete(self, key: str, *, version: Version | None = None) -> bool:
        """See :meth:`RendezvousBackend.delete`."""
        path = self._file(check_key(key))
        with self._locked():
            current = self._read(path)
            if current is None or (version is not None and current.version != version):
                return False
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._publish(self._revision() + 1)
            return True

    def list(self, prefix: str) -> dict[str, Entry]:
        """See :meth:`RendezvousBackend.list`."""
        check_key(prefix, prefix=True)
        head, sep, _ = prefix.partition("/")
        if sep:
            dirs = [urllib.parse.quote(head, safe="")]
        else:
            try:
                dirs = [d for d in os.listdir(self.kv) if not d.startswith(".")]
            except FileNotFoundError:
                return {}
        out: dict[str, Entry] = {}
        for d in dirs:
            try:
                names = os.listdir(self.kv / d)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                if name.startswith("."):
                    continue
                key = self._key_of(d, name)
                if key.startswith(prefix):
                    entry = self._read(self.kv / d / name)
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
        path = self._file(check_key(key))

        def changed() -> bool:
            entry = self._read(path)
            return (None if entry is None else entry.version) != version

        return self._poll(changed, timeout)

    def watch_prefix(self, prefix: str, *, versions: Mapping[str, Version], timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch_prefix` (polls the revision file, relists on change)."""
        check_key(prefix, prefix=True)
        known = dict(versions)
        seen_rev: list[Any] = [object()]

        def changed() -> bool:
            rev = self._read_json(self._rev_path)
            if rev == seen_rev[0]:
                return False
            seen_rev[0] = rev
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
