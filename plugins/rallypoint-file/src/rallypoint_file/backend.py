"""A rendezvous backend on a (shared) file system.

Layout of ``<path>/<run_id>/``::

    FORMAT          {"format": "rallypoint-file", "version": 3, "run_id": ...}: marks the directory as ours
    lock            fcntl (flock) lock taken by every write; holds the space's revision counter
                    (versions are revisions; 20 characters, rewritten in place under the lock) and,
                    after it, the run directory's random nonce (both written with FORMAT)
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

Trust: the run directory and its files must belong to the current user (or the group named in
the options) and be writable by no one else; everything is created private (see
:mod:`rallypoint_file.trust`). While the backend is in use it checks, at least once a second,
that the run directory is still there (the same lock file), still writable, and that the
revision counter is well formed and never goes back: a deleted, replaced, read-only or corrupted
run directory fails the next call with the path named, instead of a silent hang.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rallypoint.rendezvous.backend import Entry, JSONValue, Version, check_key
from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError
from rallypoint_file.layout import (
    FORMAT,
    LOCK_RE,
    LOCK_SIZE,
    REV_WIDTH,
    TOKEN,
    dump_json,
    key_of,
    key_path,
    path_lock,
    quote,
    read_bytes,
)
from rallypoint_file.options import FileOptions
from rallypoint_file.trust import Trust

__all__ = ["CHECK_INTERVAL", "FORMAT", "FileBackend", "FileOptions", "create_file_backend"]

#: How often (seconds) a backend in use checks that its run directory is intact.
CHECK_INTERVAL = 1.0


class FileBackend:
    """A :class:`~rallypoint.rendezvous.backend.RendezvousBackend` in a directory.

    Args:
        path: the shared directory (the run's data goes to ``path/run_id``).
        run_id: the run id (letters, digits and ``. _ - ~ : @ + = ,``).
        poll_interval: see :class:`FileOptions`.
        group: see :class:`FileOptions`.
        read_only: see :class:`FileOptions`.

    Raises:
        RendezvousStateError: the run directory exists but holds foreign or corrupt data, or files
            of another user or writable by others (the message names the path and its owner);
            with ``read_only``, it does not exist.
        RendezvousBackendError: the directory cannot be created or written.
    """

    supports_ttl = False

    def __init__(
        self,
        path: str | os.PathLike[str],
        run_id: str,
        *,
        poll_interval: float = 0.01,
        group: str | None = None,
        read_only: bool = False,
    ) -> None:
        if not run_id or "/" in run_id:
            raise ValueError(f"invalid run_id {run_id!r} for the file rendezvous backend: no '/' allowed")
        check_key(run_id)
        self.run_id = run_id
        self.base = Path(path)
        self.root = self.base / run_id
        self.kv = self.root / "kv"
        self._kv = str(self.kv)
        self.poll_interval = poll_interval
        self.read_only = read_only
        self.trust = Trust.for_group(group)
        self._lock_path = self.root / "lock"
        self._lock_file = str(self._lock_path)
        #: The highest revision this client wrote or read: the counter may never fall below it.
        self._max_rev = 0
        self._next_check = 0.0
        #: what a check found wrong with the run directory: raised again by every later call
        self._broken: RendezvousStateError | None = None
        self._nonce: bytes | None = None
        if read_only:
            self._open_existing()
        else:
            self._create()
        self._tlock = path_lock(self.root.resolve())
        if not read_only:
            self._init_format()

    # -- opening -------------------------------------------------------------------------
    def _create(self) -> None:
        """Create (or check) the base directory, the run directory, ``kv/`` and the lock file."""
        where = self.base
        try:
            self.trust.make_dirs(self.base)
            self.trust.check_base(self.base)
            for where in (self.root, self.kv):
                self.trust.make_dir(where)
            where = self._lock_path
            with contextlib.suppress(FileExistsError):
                fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, self.trust.file_mode)
                try:
                    self.trust.fix_file(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise RendezvousBackendError(f"cannot create rendezvous directory or file {where}: {exc}") from exc
        self.trust.check_tree(self.root)

    def _open_existing(self) -> None:
        """Read-only: check an existing run directory and its FORMAT; create nothing."""
        if not self.root.is_dir():
            raise RendezvousStateError(
                f"no rendezvous state for run {self.run_id!r}: no rendezvous directory {self.root} (no job with "
                f"that run id has used rendezvous.options.path {self.base}); check the path and the run id"
            )
        self.trust.check_base(self.base)
        self.trust.check_tree(self.root)
        try:
            self._parse_lock(read_bytes(self._lock_file))
        except FileNotFoundError:
            raise RendezvousStateError(f"{self.root} has no lock file: not a rallypoint rendezvous directory") from None
        self._check_format(self._read_json(str(self.root / "FORMAT")))

    # -- files ---------------------------------------------------------------------------
    def _init_format(self) -> None:
        fmt = self.root / "FORMAT"
        with self._locked() as fd:
            if not fmt.exists():
                others = [p.name for p in self.root.iterdir() if p.name not in ("kv", "lock", "FORMAT")]
                if others or any(self.kv.iterdir()):
                    raise RendezvousStateError(
                        f"{self.root} is not a rallypoint rendezvous directory (it has no FORMAT file but holds "
                        f"{sorted(others) or 'files under kv/'}); choose another rendezvous.options.path or run_id"
                    )
                nonce = secrets.token_hex(16).encode()
                try:
                    os.pwrite(fd, b"%*d %s" % (REV_WIDTH, 0, nonce), 0)
                except OSError as exc:
                    raise RendezvousBackendError(f"cannot write the revision counter {self._lock_path}: {exc}") from exc
                self._nonce = nonce
                self._atomic_write(str(fmt), json.dumps({**FORMAT, "run_id": self.run_id}))
                return
            self._check_format(self._read_json(str(fmt)))
            self._parse_lock(os.pread(fd, 64, 0))

    def _check_format(self, data: Any) -> None:
        fmt = self.root / "FORMAT"
        if not isinstance(data, dict) or data.get("format") != FORMAT["format"] or data.get("run_id") != self.run_id:
            raise RendezvousStateError(
                f"{fmt} does not describe a rallypoint-file rendezvous of run {self.run_id!r} (found {data!r}); "
                f"choose another rendezvous.options.path or delete the directory"
            )
        if data.get("version") != FORMAT["version"]:
            raise RendezvousStateError(
                f"{fmt} has format version {data.get('version')!r}; this rallypoint-file reads version "
                f"{FORMAT['version']}: use the same rallypoint-file on every node, and a new run_id"
            )

    def _gone(self, what: str) -> RendezvousStateError:
        return RendezvousStateError(
            f"the rendezvous directory {self.root} of run {self.run_id!r} was {what} while the job ran "
            f"({self._lock_path}); this node stops. Start the job again (a new run_id avoids mixing with "
            "whatever is there now)"
        )

    def _verify(self) -> None:
        """At most once per :data:`CHECK_INTERVAL`: :meth:`check_intact` (a verdict found is final)."""
        if self._broken is not None:
            raise self._broken
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + CHECK_INTERVAL
            self.check_intact()

    def check_intact(self) -> None:
        """Check that the run directory is the one this backend opened, writable and uncorrupted.

        The node's threads share the check (it runs at most once per :data:`CHECK_INTERVAL`), so
        what it finds is kept: every later call of this backend raises it again, whichever
        thread made the check and whatever that thread did with the error.

        Raises:
            RendezvousStateError: it was deleted or replaced, the revision counter is corrupt or
                went back, or it can no longer be written (made read-only or immutable). Each is
                for good, not an outage to ride out: the node stops at once.
        """
        if self._broken is not None:
            raise self._broken
        try:
            self._check_intact()
        except RendezvousStateError as exc:
            self._broken = exc
            raise

    def _check_intact(self) -> None:
        try:
            fd = os.open(self._lock_file, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise self._gone("deleted") from None
        except OSError as exc:
            raise RendezvousStateError(f"cannot open the rendezvous lock file {self._lock_path}: {exc}") from exc
        try:
            try:  # no writer is half-way through the counter; readers never wait for writers
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                self._next_check = time.monotonic() + 0.05  # a write is under way: look again soon
            else:
                self._parse_lock(os.pread(fd, 64, 0))
        finally:
            os.close(fd)
        if self.read_only:
            return
        for path in (self.root, self.kv, self._lock_path):
            if not os.access(path, os.W_OK):
                raise RendezvousStateError(
                    f"rendezvous {'file' if path == self._lock_path else 'directory'} {path} of run "
                    f"{self.run_id!r} can no longer be written (made read-only or immutable while the job ran); "
                    "this node stops"
                )

    def _parse_lock(self, raw: bytes) -> int:
        """The revision counter: well formed, of this run directory, and not below any revision seen.

        The first call records the run directory's nonce; later calls compare with it.
        """
        m = LOCK_RE.fullmatch(raw) if len(raw) == LOCK_SIZE else None
        if m is None:
            raise RendezvousStateError(
                f"rendezvous revision counter in {self._lock_path} is corrupt (found {raw[:64]!r}); "
                f"the run directory {self.root} cannot be trusted: stop the job and start it with a new run_id"
            )
        if self._nonce is None:
            self._nonce = m.group(2)
        elif m.group(2) != self._nonce:
            raise self._gone("replaced")
        rev = int(m.group(1))
        if rev < self._max_rev:
            raise RendezvousStateError(
                f"rendezvous revision counter in {self._lock_path} went back from {self._max_rev} to {rev} "
                f"(rewritten by something else than rallypoint); the run directory {self.root} cannot be trusted: "
                "stop the job and start it with a new run_id"
            )
        return rev

    def _path(self, key: str) -> str:
        return key_path(self._kv, key)

    def _file(self, key: str) -> Path:
        """The file that holds ``key``."""
        return Path(self._path(key))

    def _read_json(self, path: str) -> Any:
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
        if data["v"] > self._max_rev:
            self._max_rev = data["v"]
        return Entry(data["value"], data["v"])

    def _atomic_write(self, path: str, text: str) -> None:
        directory, name = os.path.split(path)
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.trust.file_mode)
            try:
                self.trust.fix_file(fd)
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
        if self.read_only:
            raise RendezvousBackendError(
                f"the rendezvous directory {self.root} was opened read-only (rallypoint status); it cannot be written"
            )
        with self._tlock:
            try:
                fd = os.open(self._lock_file, os.O_RDWR | os.O_NOFOLLOW)
            except FileNotFoundError:
                raise self._gone("deleted") from None
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
        except OSError as exc:
            raise RendezvousBackendError(f"cannot read the revision counter in {self._lock_path}: {exc}") from exc
        rev = self._parse_lock(raw) + 1
        try:
            os.pwrite(fd, b"%*d" % (REV_WIDTH, rev), 0)
        except OSError as exc:
            raise RendezvousBackendError(f"cannot update the revision counter in {self._lock_path}: {exc}") from exc
        self._max_rev = rev
        return rev

    def _publish(self, directory: str, rev: int) -> None:
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
        try:
            self.trust.make_dir(Path(directory))
        except OSError as exc:
            raise RendezvousBackendError(f"cannot create rendezvous directory {directory}: {exc}") from exc
        self._atomic_write(path, f'{{"v":{rev},"value":{value_text}}}')
        self._publish(directory, rev)
        return rev

    # -- protocol ------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """See :meth:`RendezvousBackend.get`."""
        self._verify()
        return self._read(self._path(check_key(key)))

    def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
        """See :meth:`RendezvousBackend.set`."""
        self._no_ttl(ttl)
        check_key(key)
        text = dump_json(value)
        self._verify()
        with self._locked() as fd:
            return self._put(fd, key, text)

    def compare_and_set(
        self, key: str, value: JSONValue, *, version: Version | None, ttl: float | None = None
    ) -> tuple[bool, Entry | None]:
        """See :meth:`RendezvousBackend.compare_and_set`."""
        self._no_ttl(ttl)
        check_key(key)
        text = dump_json(value)
        self._verify()
        with self._locked() as fd:
            current = self._read(self._path(key))
            if (None if current is None else current.version) != version:
                return False, current
            rev = self._put(fd, key, text)
            return True, Entry(json.loads(text), rev)

    def add(self, key: str, amount: int = 1) -> int:
        """See :meth:`RendezvousBackend.add`."""
        check_key(key)
        self._verify()
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
        self._verify()
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
        self._verify()
        head, sep, _ = prefix.partition("/")
        if sep:
            dirs = [quote(head)]
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
                key = key_of(d, name)
                if key.startswith(prefix):
                    entry = self._read(os.path.join(directory, name))
                    if entry is not None:
                        out[key] = entry
        return out

    def _poll(self, changed: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        pause = 0.0005
        while True:
            self._verify()
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
            if entry is None and version is not None:
                self.check_intact()  # deleted, or was the whole run directory?
            return (None if entry is None else entry.version) != version

        return self._poll(changed, timeout)

    def _token_paths(self, prefix: str) -> tuple[str, ...]:
        """The change tokens that move on every write under ``prefix``."""
        head, sep, _ = prefix.partition("/")
        if sep:
            return (os.path.join(self._kv, quote(head), TOKEN),)
        try:  # no '/': the prefix may match keys of any directory (rare; the handler never does this)
            dirs = sorted(d for d in os.listdir(self._kv) if not d.startswith("."))
        except FileNotFoundError:
            dirs = []
        return tuple(os.path.join(self._kv, d, TOKEN) for d in dirs)

    def _token(self, path: str) -> bytes | None:
        """A change token's bytes (``None`` while its directory has never been written)."""
        try:
            return read_bytes(path)
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
    return FileBackend(opts.path, run_id, poll_interval=opts.poll_interval, group=opts.group, read_only=opts.read_only)
