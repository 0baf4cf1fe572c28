"""Is the run directory still the one this backend opened? The file backend's integrity check.

While the backend is in use, :class:`RunIntegrity` checks at least once per
:data:`CHECK_INTERVAL` that the run directory is still there (the same lock file: its nonce),
still writable, and that the revision counter is well formed and never goes back. A deleted,
replaced, read-only or corrupted run directory then fails the next call with the path named,
instead of a silent hang; the verdict is final (every later call raises it again).
"""

from __future__ import annotations

import fcntl
import os
import time

from rallypoint.rendezvous.errors import RendezvousStateError
from rallypoint_file.layout import LOCK_RE, LOCK_SIZE, RunPaths

__all__ = ["CHECK_INTERVAL", "RunIntegrity"]

#: How often (seconds) a backend in use checks that its run directory is intact.
CHECK_INTERVAL = 1.0


class RunIntegrity:
    """What one backend knows of its run directory, and the check that it is still intact.

    Args:
        paths: the run's files.
        read_only: the backend only reads (writability is not checked).

    Attributes:
        max_rev: the highest revision this backend wrote or read: the counter may never fall
            below it.
        nonce: the run directory's nonce (from its lock file), once read or written.
    """

    def __init__(self, paths: RunPaths, *, read_only: bool) -> None:
        self.paths = paths
        self.read_only = read_only
        self.max_rev = 0
        self.nonce: bytes | None = None
        self._next_check = 0.0
        #: what a check found wrong with the run directory: raised again by every later call
        self._broken: RendezvousStateError | None = None

    def seen(self, rev: int) -> None:
        """A revision read or written (the counter may never fall below it)."""
        if rev > self.max_rev:
            self.max_rev = rev

    def gone(self, what: str) -> RendezvousStateError:
        """The error of a run directory that was ``what`` (deleted, replaced) while the job ran."""
        return RendezvousStateError(
            f"the rendezvous directory {self.paths.root} of run {self.paths.run_id!r} was {what} while the job ran "
            f"({self.paths.lock}); this node stops. Start the job again (a new run_id avoids mixing with "
            "whatever is there now)"
        )

    def verify(self) -> None:
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
        lock = self.paths.lock
        try:
            fd = os.open(str(lock), os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise self.gone("deleted") from None
        except OSError as exc:
            raise RendezvousStateError(f"cannot open the rendezvous lock file {lock}: {exc}") from exc
        try:
            try:  # no writer is half-way through the counter; readers never wait for writers
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                self._next_check = time.monotonic() + 0.05  # a write is under way: look again soon
            else:
                self.parse_lock(os.pread(fd, 64, 0))
        finally:
            os.close(fd)
        if self.read_only:
            return
        for path in (self.paths.root, self.paths.kv, lock):
            if not os.access(path, os.W_OK):
                raise RendezvousStateError(
                    f"rendezvous {'file' if path == lock else 'directory'} {path} of run "
                    f"{self.paths.run_id!r} can no longer be written (made read-only or immutable while the job ran); "
                    "this node stops"
                )

    def parse_lock(self, raw: bytes) -> int:
        """The revision counter: well formed, of this run directory, and not below any revision seen.

        The first call records the run directory's nonce; later calls compare with it.
        """
        m = LOCK_RE.fullmatch(raw) if len(raw) == LOCK_SIZE else None
        if m is None:
            raise RendezvousStateError(
                f"rendezvous revision counter in {self.paths.lock} is corrupt (found {raw[:64]!r}); "
                f"the run directory {self.paths.root} cannot be trusted: stop the job and start it with a new run_id"
            )
        if self.nonce is None:
            self.nonce = m.group(2)
        elif m.group(2) != self.nonce:
            raise self.gone("replaced")
        rev = int(m.group(1))
        if rev < self.max_rev:
            raise RendezvousStateError(
                f"rendezvous revision counter in {self.paths.lock} went back from {self.max_rev} to {rev} "
                f"(rewritten by something else than rallypoint); the run directory {self.paths.root} cannot be "
                "trusted: stop the job and start it with a new run_id"
            )
        return rev
