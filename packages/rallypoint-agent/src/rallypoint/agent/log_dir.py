"""The run's log directory: only this user can write it, nothing in it is reached through a link, one run each.

Worker logs, error files, timelines and ``failure.json`` go under ``agent.log_dir``
(``runs/{run_id}`` by default). Another user who could write there could redirect them (a link at
``attempt_0/rank_0.log`` makes a root job overwrite any file) or read every worker's output. So
the log directory follows the ``file`` rendezvous backend's rules
(:class:`rallypoint.core.file_trust.FileTrust`):

* the log directory, and what rallypoint keeps in it (``run.json``, ``failure.json``,
  ``attempt_<N>/`` and everything under it, the watchdog's FIFO or socket): no symbolic link,
  owned by you, writable by nobody else;
* the directories on the way to it: only their owners may change them
  (:meth:`~rallypoint.core.file_trust.FileTrust.path_problem`);
* what rallypoint creates is private (directories ``0700``, files ``0600``, whatever the umask),
  and files are created with ``O_CREAT | O_EXCL | O_NOFOLLOW``: whatever is in the way is
  refused or left alone, never followed or truncated.

Anything else is refused before any worker starts: :class:`LogDirError` (exit 2), one line that
names the path and what to do.

A log directory holds one run, named in its ``run.json``. When the configured one holds the logs
of an earlier run, this run's go to the first free sibling (``runs/x.1``, ``runs/x.2``, ...) and
the agent says so: nothing of the earlier run is overwritten. The nodes of one job (agents of one
run id sharing a file system) share one directory.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from pathlib import Path

from rallypoint.core.errors import EXIT_USAGE, RallypointError
from rallypoint.core.file_trust import FileTrust

__all__ = ["CLAIM", "LogDirError", "check_location", "claim", "create_file", "private_dir", "release"]

#: The file that names the run a log directory belongs to.
CLAIM = "run.json"
#: Siblings tried for a run whose configured log directory holds an earlier run's logs.
MAX_SIBLINGS = 1000
#: Entries of a log directory that rallypoint writes (and so checks).
_OURS = re.compile(r"attempt_\d+|failure\.json|run\.json|watchdog\.(fifo|sock)|\.(failure|run)\.json\..*")
#: Entries that show a directory holds a run's logs.
_LOGS = re.compile(r"attempt_\d+|failure\.json")
_WHAT_TO_DO = (
    "Give the job a log directory of its own (--log-dir DIR or agent.log_dir); if it is yours, remove it "
    "or 'chmod go-w' it (see the security page of the rallypoint docs)"
)


class LogDirError(RallypointError):
    """The log directory could let another user redirect or read the job's logs (exit 2, before any worker)."""

    exit_code = EXIT_USAGE


def _trust() -> FileTrust:
    return FileTrust(os.geteuid())


def _refuse(log_dir: Path, path: str | os.PathLike[str], why: str) -> LogDirError:
    """The one-line refusal of ``log_dir`` because ``path`` (it, or something in it or on the way) ``why``."""
    subject = "it" if os.path.abspath(path) == os.path.abspath(log_dir) else os.path.abspath(path)
    return LogDirError(
        f"refusing log directory {os.path.abspath(log_dir)}: {subject} {why}; another user could redirect or "
        f"read the job's logs through it. {_WHAT_TO_DO}"
    )


def _check(log_dir: Path, trust: FileTrust) -> None:
    """Refuse ``log_dir`` unless it, and what rallypoint keeps in it, may be trusted."""
    st = os.lstat(log_dir)
    why = trust.problem(st) or (None if stat.S_ISDIR(st.st_mode) else "is not a directory")
    if why is not None:
        raise _refuse(log_dir, log_dir, why)
    for entry in os.scandir(log_dir):
        if not _OURS.fullmatch(entry.name):
            continue  # not rallypoint's (a log directory may be a directory of the user's)
        for path, entry_st in trust.tree(Path(entry.path)):
            why = trust.problem(entry_st)
            if why is not None:
                raise _refuse(log_dir, path, why)


def check_location(log_dir: Path) -> None:
    """Refuse a log directory another user could write or redirect; create it (``0700``) if missing.

    Raises:
        LogDirError: a directory on the way, the log directory or an entry of rallypoint's in it
            is not trusted.
        OSError: it cannot be created.
    """
    trust = _trust()
    on_the_way = trust.path_problem(log_dir)
    if on_the_way is not None:
        where, why = on_the_way
        raise _refuse(log_dir, where, f"(on the way to it) {why}")
    trust.make_dirs(log_dir)
    _check(log_dir, trust)


def _read_claim(directory: Path) -> str | None:
    """The run id ``directory`` was claimed for (``""`` when unreadable), ``None`` when it was not."""
    try:
        fd = os.open(directory / CLAIM, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(65536)
    try:
        run_id = json.loads(raw).get("run_id")
    except (ValueError, AttributeError):
        return ""
    return run_id if isinstance(run_id, str) else ""


def _write_claim(directory: Path, run_id: str, trust: FileTrust) -> bool:
    """Claim ``directory`` for ``run_id``, whole or not at all; ``False`` when another claimed it first."""
    tmp = directory / f".{CLAIM}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, trust.file_mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"run_id": run_id, "pid": os.getpid()}, f)
        os.link(tmp, directory / CLAIM)  # atomic, and never over an existing claim
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


def _holds_logs(directory: Path) -> bool:
    return any(_LOGS.fullmatch(entry.name) for entry in os.scandir(directory))


def claim(log_dir: Path, run_id: str, *, shared: bool) -> tuple[Path, bool]:
    """The directory this run's logs go to: ``log_dir``, or its first free sibling; created private and checked.

    Returns the directory, and whether this call created it.

    Args:
        log_dir: the configured log directory (``agent.log_dir``).
        run_id: the run's id, written to the directory's ``run.json``.
        shared: other agents of the same run may use the directory (several nodes on one file
            system): a directory claimed for ``run_id`` is taken. Otherwise any claimed one, or
            one that holds logs, belongs to an earlier run.

    Raises:
        LogDirError: a directory looked at is not trusted, or every sibling is taken.
        OSError: a directory cannot be created or read.
    """
    trust = _trust()
    check_location(log_dir)
    for k in range(MAX_SIBLINGS):
        candidate = log_dir if k == 0 else log_dir.with_name(f"{log_dir.name}.{k}")
        created = trust.make_dir(candidate)
        _check(candidate, trust)
        owner = _read_claim(candidate)
        if owner is None and (created or not _holds_logs(candidate)):
            if _write_claim(candidate, run_id, trust):
                return candidate, created
            owner = _read_claim(candidate)  # another agent of this host or file system was first
        if shared and owner == run_id:
            return candidate, False
    raise LogDirError(
        f"the log directory {os.path.abspath(log_dir)} and its siblings .1 to .{MAX_SIBLINGS - 1} all hold the "
        "logs of earlier runs; remove some, or give another --log-dir (agent.log_dir)"
    )


def release(directory: Path, created: bool) -> None:
    """Give back a log directory this run claimed and wrote nothing to (its ``run.json`` goes; it too, if ``created``).

    For a run refused before it started (a finished run id): a later run then finds no trace of it.
    """
    try:
        if os.listdir(directory) != [CLAIM]:
            return
        os.unlink(directory / CLAIM)
        if created:
            os.rmdir(directory)
    except OSError:
        pass


def private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents (``0700``), or check the directory there; returns ``path``.

    Raises:
        LogDirError: ``path`` is a link, another user's, or writable by others.
        OSError: it cannot be created.
    """
    trust = _trust()
    trust.make_dirs(path)
    st = os.lstat(path)
    why = trust.problem(st) or (None if stat.S_ISDIR(st.st_mode) else "is not a directory")
    if why is not None:
        raise _refuse(path.parent, path, why)
    return path


def create_file(path: Path) -> int:
    """Create the file ``path`` (``0600``) without following a link; its descriptor.

    Raises:
        FileExistsError: a file of this user's is there already (choose another name).
        LogDirError: something else is there (a link, another user's file).
        OSError: it cannot be created.
    """
    trust = _trust()
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, trust.file_mode)
    except FileExistsError:
        st = os.lstat(path)
        why = trust.problem(st) or (None if stat.S_ISREG(st.st_mode) else "is not a regular file")
        if why is not None:
            raise _refuse(path.parent, path, why) from None
        raise
