"""Kill worker sessions, and the sentinel process that does it when the agent dies.

Every worker leads its own session (``setsid``), and whatever it starts inherits that session:
its children, their children, including those put in a process group of their own (a shell with
job control, ``Popen(process_group=0)``). A session is therefore the worker's whole tree, short of
a process that starts a session of its own (a daemon, ``setsid cmd``), which has left the job by
design. :func:`kill_sessions` kills every member: the session's own process group at once, then
every process that ``/proc`` lists in the session, again until none is left (a process may fork
while it is killed).

An agent killed with ``SIGKILL`` runs no code, and the kernel's parent-death signal reaches only
the workers themselves, so the agent starts this module as a separate, tiny **sentinel** process
(``python -I -S sentinel.py``, in a session of its own so that signals for the job's process
groups and the terminal's Ctrl-C never reach it). Its stdin is the read end of a pipe whose only
write end the agent holds; the agent writes ``+<sid>`` when it starts a worker and ``-<sid>``
after the worker's session was killed, before it reaps the worker. When the agent exits in any
way, ``SIGKILL`` included, the kernel closes the write end; the sentinel reads end-of-file,
kills every session still registered, and exits. It costs the agent one pipe write per worker
and stop, and nothing while it waits (a blocking read).

Session ids are process ids of session leaders: a number cannot be reused while a process is
still in that session, and the agent deregisters a session before it reaps the worker whose
pid names it, so the sentinel never signals an unrelated session.

This file runs as a script with no imports beyond the standard library; :mod:`rallypoint.agent.workers`
imports it as a module for :func:`kill_sessions` and the agent side (:class:`Sentinel`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable

__all__ = ["Sentinel", "kill_sessions", "session_members"]

#: Rounds of "scan /proc, kill what is left" before giving up on a process that keeps forking.
_ROUNDS = 50


def session_members(sids: Iterable[int]) -> list[tuple[int, int, int]]:
    """Return ``(pid, pgid, sid)`` of each live (non-zombie) process whose session is in ``sids``.

    Reads Linux's ``/proc``; elsewhere it returns nothing (process groups are all one can reach).
    """
    wanted = set(sids)
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3 and fields[0] not in (b"Z", b"X") and int(fields[3]) in wanted:
            found.append((int(entry), int(fields[2]), int(fields[3])))
    return found


def kill_sessions(sids: Iterable[int]) -> None:
    """SIGKILL every process in the sessions ``sids``; returns once none is left outside the leaders' groups.

    Each session's own process group (pgid == sid) gets ``killpg`` at once; members that moved
    to another process group are found in ``/proc`` and killed one by one, again until a scan
    finds none (one may fork while it is killed), at most a bounded number of rounds. Processes
    that left the session (``setsid``) are not reached.
    """
    sid_list = list(sids)
    if not sid_list:
        return
    for sid in sid_list:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signal.SIGKILL)
    me = os.getpid()
    for _ in range(_ROUNDS):
        others = [pid for pid, pgid, sid in session_members(sid_list) if pgid != sid and pid != me]
        if not others:
            return
        for pid in others:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


class Sentinel:
    """The agent's end: starts the sentinel process on first use and tells it about sessions.

    One per agent process (see :func:`shared`). Thread-safe; never raises: without a sentinel
    (it could not start, or was killed), workers still die with the agent by their parent-death
    signal, only what they started may outlive a ``SIGKILL``-ed agent.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = -1
        self._process: subprocess.Popen[bytes] | None = None

    def _ensure(self) -> int | None:
        if self._fd is not None and self._pid == os.getpid():
            return self._fd
        read_fd, write_fd = os.pipe()  # both close-on-exec: no worker inherits the write end
        try:
            self._process = subprocess.Popen(
                [sys.executable or "python3", "-I", "-S", os.path.abspath(__file__)],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",  # pins no directory of the job
                start_new_session=True,
            )
        except (OSError, ValueError) as err:
            os.close(write_fd)
            print(f"rallypoint: cannot start the worker sentinel ({err}); processes started by workers "
                  "may outlive an agent killed with SIGKILL", file=sys.stderr)  # fmt: skip
            return None
        finally:
            os.close(read_fd)
        self._fd, self._pid = write_fd, os.getpid()
        return write_fd

    def _send(self, line: str) -> None:
        with self._lock:
            fd = self._ensure()
            if fd is not None:
                with contextlib.suppress(OSError):  # sentinel gone: EPIPE
                    os.write(fd, line.encode())

    def register(self, sid: int) -> None:
        """Have session ``sid`` killed if this process ends before :meth:`unregister`."""
        self._send(f"+{sid}\n")

    def unregister(self, sid: int) -> None:
        """Forget session ``sid`` (call after killing it, before reaping its leader)."""
        self._send(f"-{sid}\n")

    @property
    def pid(self) -> int | None:
        """The sentinel's process id, once started."""
        return self._process.pid if self._process is not None else None


_shared = Sentinel()


def shared() -> Sentinel:
    """Return the sentinel of this process (started on first registration)."""
    return _shared


def main() -> None:
    """The sentinel process: read ``+sid`` / ``-sid`` lines until end-of-file, then kill what is left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sids: set[int] = set()
    pending = b""
    while True:
        try:
            chunk = os.read(0, 4096)
        except InterruptedError:  # pragma: no cover - Python retries EINTR itself
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line[:1] == b"+":
                sids.add(int(line[1:]))
            elif line[:1] == b"-":
                sids.discard(int(line[1:]))
    if sids:
        kill_sessions(sids)


if __name__ == "__main__":
    main()
