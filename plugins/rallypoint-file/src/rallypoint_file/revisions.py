"""The file backend's write lock and revision counter.

Every write takes the lock (``flock`` on the run directory's lock file, and an in-process lock
shared by the threads of one process) and bumps the revision counter at the start of that file
before it writes any data: versions are revisions, and no revision is ever given to two writes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator

from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint_file.integrity import RunIntegrity
from rallypoint_file.layout import REV_WIDTH, path_lock

__all__ = ["RevisionLock"]


class RevisionLock:
    """The write lock of one run directory and the revision counter it guards.

    Args:
        integrity: the run directory's integrity check (its paths; the counter is checked
            against it, and revisions written are recorded there).
        read_only: the backend was opened read-only: taking the lock is an error.
    """

    def __init__(self, integrity: RunIntegrity, *, read_only: bool) -> None:
        self.integrity = integrity
        self.paths = integrity.paths
        self.read_only = read_only
        self._tlock = path_lock(self.paths.root.resolve())

    @contextlib.contextmanager
    def locked(self) -> Iterator[int]:
        """Hold the write lock; yields the lock file's descriptor (which holds the counter)."""
        if self.read_only:
            raise RendezvousBackendError(
                f"the rendezvous directory {self.paths.root} was opened read-only (rallypoint status); "
                "it cannot be written"
            )
        lock = self.paths.lock
        with self._tlock:
            try:
                fd = os.open(str(lock), os.O_RDWR | os.O_NOFOLLOW)
            except FileNotFoundError:
                raise self.integrity.gone("deleted") from None
            except OSError as exc:
                raise RendezvousBackendError(f"cannot open lock file {lock}: {exc}") from exc
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
                        raise RendezvousBackendError(f"cannot lock {lock}: {exc}") from exc
                yield fd
            finally:
                os.close(fd)  # releases the lock

    def next_revision(self, fd: int) -> int:
        """Bump the revision counter (the lock is held on ``fd``) and return the new revision.

        The counter moves before the data is written, so a writer that dies half-way only skips
        a number: no revision is ever given to two writes.
        """
        try:
            raw = os.pread(fd, 64, 0)
        except OSError as exc:
            raise RendezvousBackendError(f"cannot read the revision counter in {self.paths.lock}: {exc}") from exc
        rev = self.integrity.parse_lock(raw) + 1
        try:
            os.pwrite(fd, b"%*d" % (REV_WIDTH, rev), 0)
        except OSError as exc:
            raise RendezvousBackendError(f"cannot update the revision counter in {self.paths.lock}: {exc}") from exc
        self.integrity.max_rev = rev
        return rev
