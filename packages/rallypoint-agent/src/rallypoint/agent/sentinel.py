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
(``python -I -S sentinel.py`` by ``posix_spawn``, in a session of its own so that signals for the
job's process groups and the terminal's Ctrl-C never reach it). Its stdin is the read end of a
pipe whose only write end the agent holds; the agent writes ``+<sid>`` when it starts a worker
and ``-<sid>`` after the worker's session was killed, before it reaps the worker. When the agent
exits in any way, ``SIGKILL`` included, the kernel closes the write end; the sentinel reads
end-of-file, kills every session still registered, and exits. It costs the agent one pipe write
per worker and stop, and nothing while it waits (a blocking read).

Session ids are process ids of session leaders: a number cannot be reused while a process is
still in that session, and the agent deregisters a session before it reaps the worker whose
pid names it, so the sentinel never signals an unrelated session.

This file runs as a script (``python -I -S``, importing only :mod:`os` and :mod:`signal`, so it
starts in a few milliseconds); :mod:`rallypoint.agent.workers` imports it for :func:`kill_sessions`
and holds the agent's end of the pipe.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

__all__ = ["kill_sessions", "main", "session_members"]

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
        try:  # os.open/os.read: half the cost of open(); the fields needed are in the first 100 bytes
            fd = os.open(f"/proc/{entry}/stat", os.O_RDONLY)
        except OSError:  # gone meanwhile
            continue
        try:
            stat = os.read(fd, 512)
        except OSError:
            continue
        finally:
            os.close(fd)
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
        try:  # noqa: SIM105 - no contextlib: it would slow the sentinel's start
            os.killpg(sid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # group gone, or zombies only
            pass
    me = os.getpid()
    for _ in range(_ROUNDS):
        others = [pid for pid, pgid, sid in session_members(sid_list) if pgid != sid and pid != me]
        if not others:
            return
        for pid in others:
            try:  # noqa: SIM105
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def main() -> None:
    """The sentinel process: read ``+sid`` / ``-sid`` lines until end-of-file, then kill what is left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.chdir("/")  # pin no directory of the job
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
