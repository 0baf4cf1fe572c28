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

:class:`FileBackend` is the key-value protocol; each of its other jobs has a module named for
it: :mod:`~rallypoint_file.run_directory` (creating or opening the run directory, ``FORMAT``),
:mod:`~rallypoint_file.integrity` (the check that it is intact), :mod:`~rallypoint_file.revisions`
(the write lock and the counter), :mod:`~rallypoint_file.state_files` (reading and writing the
key files and change tokens) and :mod:`~rallypoint_file.watching` (how watches poll).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rallypoint.rendezvous.backend import Entry, JSONValue, Version, check_key
from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint_file import run_directory
from rallypoint_file.integrity import CHECK_INTERVAL, RunIntegrity
from rallypoint_file.layout import FORMAT, RunPaths, dump_json, key_of, key_path, quote
from rallypoint_file.options import FileOptions
from rallypoint_file.revisions import RevisionLock
from rallypoint_file.state_files import atomic_write, publish, read_record
from rallypoint_file.trust import Trust
from rallypoint_file.watching import poll, read_token, token_paths

__all__ = ["CHECK_INTERVAL", "FORMAT", "FileBackend", "FileOptions", "create_file_backend"]


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
        self.paths = RunPaths.of(self.base, run_id)
        self.root = self.paths.root
        self.kv = self.paths.kv
        self._kv = str(self.kv)
        self.poll_interval = poll_interval
        self.read_only = read_only
        self.trust = Trust.for_group(group)
        self._integrity = RunIntegrity(self.paths, read_only=read_only)
        if read_only:
            run_directory.open_existing(self.paths, self.trust, self._integrity)
        else:
            run_directory.create(self.paths, self.trust)
        self._revisions = RevisionLock(self._integrity, read_only=read_only)
        if not read_only:
            run_directory.init_format(self.paths, self.trust, self._revisions)

    # -- the run directory ---------------------------------------------------------------
    def check_intact(self) -> None:
        """Check that the run directory is the one this backend opened, writable and uncorrupted.

        The node's threads share the check (it runs at most once per :data:`CHECK_INTERVAL`), so
        what it finds is kept: every later call of this backend raises it again, whichever
        thread made the check and whatever that thread did with the error
        (see :class:`~rallypoint_file.integrity.RunIntegrity`).

        Raises:
            RendezvousStateError: it was deleted or replaced, the revision counter is corrupt or
                went back, or it can no longer be written (made read-only or immutable). Each is
                for good, not an outage to ride out: the node stops at once.
        """
        self._integrity.check_intact()

    def _verify(self) -> None:
        self._integrity.verify()

    # -- files ---------------------------------------------------------------------------
    def _path(self, key: str) -> str:
        return key_path(self._kv, key)

    def _file(self, key: str) -> Path:
        """The file that holds ``key``."""
        return Path(self._path(key))

    def _read(self, path: str) -> Entry | None:
        entry = read_record(path, self.root)
        if entry is not None:
            self._integrity.seen(entry.version)
        return entry

    def _put(self, fd: int, key: str, value_text: str) -> int:
        rev = self._revisions.next_revision(fd)
        path = self._path(key)
        directory = os.path.dirname(path)
        try:
            self.trust.make_dir(Path(directory))
        except OSError as exc:
            raise RendezvousBackendError(f"cannot create rendezvous directory {directory}: {exc}") from exc
        atomic_write(path, f'{{"v":{rev},"value":{value_text}}}', self.trust)
        publish(directory, rev, self.trust)
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
        with self._revisions.locked() as fd:
            return self._put(fd, key, text)

    def compare_and_set(
        self, key: str, value: JSONValue, *, version: Version | None, ttl: float | None = None
    ) -> tuple[bool, Entry | None]:
        """See :meth:`RendezvousBackend.compare_and_set`."""
        self._no_ttl(ttl)
        check_key(key)
        text = dump_json(value)
        self._verify()
        with self._revisions.locked() as fd:
            current = self._read(self._path(key))
            if (None if current is None else current.version) != version:
                return False, current
            rev = self._put(fd, key, text)
            return True, Entry(json.loads(text), rev)

    def add(self, key: str, amount: int = 1) -> int:
        """See :meth:`RendezvousBackend.add`."""
        check_key(key)
        self._verify()
        with self._revisions.locked() as fd:
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
        with self._revisions.locked() as fd:
            current = self._read(path)
            if current is None or (version is not None and current.version != version):
                return False
            rev = self._revisions.next_revision(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            publish(os.path.dirname(path), rev, self.trust)
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
        return poll(changed, timeout, verify=self._verify, poll_interval=self.poll_interval)

    def watch(self, key: str, *, version: Version | None, timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch` (polls the key's file)."""
        path = self._path(check_key(key))

        def changed() -> bool:
            entry = self._read(path)
            if entry is None and version is not None:
                self.check_intact()  # deleted, or was the whole run directory?
            return (None if entry is None else entry.version) != version

        return self._poll(changed, timeout)

    def watch_prefix(self, prefix: str, *, versions: Mapping[str, Version], timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch_prefix`.

        Polls the change token of the prefix's directory (writes elsewhere do not wake it) and
        lists the prefix only when the token moved.
        """
        check_key(prefix, prefix=True)
        known = dict(versions)
        seen: list[Any] = [object()]

        def changed() -> bool:
            paths = token_paths(self._kv, prefix)
            tokens = (paths, tuple(read_token(p) for p in paths))
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
