"""A worker forked by the warm process, as the agent holds it: :class:`WarmProcess`.

The handle has the parts of :class:`subprocess.Popen`'s interface the agent uses (``pid``,
``args``, ``stdout``, ``stderr``, ``returncode``, ``poll``, ``wait``, ``send_signal``,
``terminate``, ``kill``), plus :meth:`WarmProcess.wait_no_reap`. The worker is the warm
process's child, not the agent's: its exit status arrives as a message
(:class:`~rallypoint.agent.warm.connection.WarmConnection` sets it), and it stays a zombie in
the warm process until the agent reaps it through the connection.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from typing import IO, Protocol

__all__ = ["Reaper", "WarmProcess"]


class Reaper(Protocol):
    """What a handle needs of its warm process's connection: reap an exited worker."""

    def reap(self, pid: int) -> None:
        """Let the warm process reap its child ``pid``."""
        ...


class WarmProcess:
    """A worker forked by the warm process, with the :class:`subprocess.Popen` interface the agent uses."""

    def __init__(self, conn: Reaper, pid: int, args: Sequence[str]) -> None:
        self._conn = conn
        self.pid = pid
        self.args = list(args)
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        #: The exit status once reaped (``-N`` for signal N), else ``None``, as for ``Popen``.
        self.returncode: int | None = None
        self._status: int | None = None
        self._reaped_elsewhere = False
        self._exited = threading.Event()

    def _set_exit(self, returncode: int, *, reaped: bool = False) -> None:
        if self._exited.is_set():
            return
        self._status = returncode
        self._reaped_elsewhere = reaped
        if reaped:
            self.returncode = returncode
        self._exited.set()

    def wait_no_reap(self, timeout: float | None = None) -> int | None:
        """Block until the worker exits; return its status, leaving it a zombie (``None`` on timeout)."""
        if not self._exited.wait(timeout):
            return None
        return self._status

    def poll(self) -> int | None:
        """The exit status if the worker ended (reaping it), else ``None``."""
        if self._exited.is_set():
            self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the worker's exit and reap it.

        Raises:
            subprocess.TimeoutExpired: it is still running after ``timeout`` seconds.
        """
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self._reap()
        assert self.returncode is not None
        return self.returncode

    def _reap(self) -> None:
        if self.returncode is None and self._status is not None:
            self.returncode = self._status
            if not self._reaped_elsewhere:
                self._conn.reap(self.pid)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the worker unless it was reaped."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        """Send ``SIGTERM``."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Send ``SIGKILL``."""
        self.send_signal(signal.SIGKILL)
