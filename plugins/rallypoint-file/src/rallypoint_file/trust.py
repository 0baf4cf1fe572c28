"""Who may share a run directory of the file backend, and the checks that hold everyone else out.

The trust model (see ``docs/security.md``): whoever can write a run directory can join the job,
rewrite its rounds and read every node's address. So a run directory and every file in it must be

* owned by the current user, or, when ``[rendezvous.options] group`` names a group, by that group;
* writable by nobody else: not by every user, and by a group only when it is the named group;
* no symbolic link (rallypoint never creates one).

Everything the backend creates gets mode ``0700``/``0600`` (``2770``/``0660`` with a group, the
directory group-owned and set-group-id so that its files inherit the group). The directory that
holds the run directories (``path``) may be shared; it must not let other users replace entries
they do not own: writable by every user only with the sticky bit (like ``/tmp``).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError

__all__ = ["Trust"]

_DOCS = "see the security page of the rallypoint docs"


def user_name(uid: int) -> str:
    """``uid 65534 (nobody)``, or ``uid 1234`` for a uid without a name."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def group_name(gid: int) -> str:
    """``gid 100 (users)``, or ``gid 1234`` for a gid without a name."""
    try:
        return f"gid {gid} ({grp.getgrgid(gid).gr_name})"
    except KeyError:
        return f"gid {gid}"


@dataclass(frozen=True)
class Trust:
    """Whose files a run directory may hold, and the modes the backend creates files with.

    Attributes:
        uid: the current (effective) user.
        gid: the group named in ``[rendezvous.options] group``; ``None`` when none is named.
    """

    uid: int
    gid: int | None = None

    @classmethod
    def for_group(cls, group: str | None) -> Trust:
        """The trust of the current user, sharing with ``group`` (a name or a number) when given.

        Raises:
            RendezvousBackendError: no such group, or the current user is not a member of it.
        """
        uid = os.geteuid()
        if group is None:
            return cls(uid)
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise RendezvousBackendError(
                f"rendezvous.options.group: there is no group {group!r} on this host; name a group every "
                "node's user belongs to, or remove the option to keep the run directory private"
            ) from None
        if uid != 0 and gid != os.getegid() and gid not in os.getgroups():
            raise RendezvousBackendError(
                f"rendezvous.options.group = {group!r}: the current user ({user_name(uid)}) is not a member "
                f"of {group_name(gid)}; files it creates could not be given that group"
            )
        return cls(uid, gid)

    @property
    def dir_mode(self) -> int:
        """Mode of the directories the backend creates."""
        return 0o700 if self.gid is None else 0o2770

    @property
    def file_mode(self) -> int:
        """Mode of the files the backend creates."""
        return 0o600 if self.gid is None else 0o660

    @property
    def shares(self) -> bool:
        """Whether a group shares the directory (new files need their mode set past the umask)."""
        return self.gid is not None

    def problem(self, st: os.stat_result) -> str | None:
        """Why a file with status ``st`` (from ``lstat``) may not be trusted; ``None`` when it may."""
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            return f"is a symbolic link owned by {user_name(st.st_uid)} (rallypoint never creates one)"
        if st.st_uid != self.uid and (self.gid is None or st.st_gid != self.gid):
            allowed = f"you ({user_name(self.uid)})"
            if self.gid is not None:
                allowed += f" or group {group_name(self.gid)}"
            return f"is owned by {user_name(st.st_uid)}, group {group_name(st.st_gid)}, not by {allowed}"
        if mode & stat.S_IWOTH:
            return f"is writable by every user (mode {mode:04o})"
        if mode & stat.S_IWGRP and st.st_gid != self.gid:
            return (
                f"is writable by group {group_name(st.st_gid)} (mode {mode:04o}), which rendezvous.options.group "
                "does not name"
            )
        return None

    def check(self, path: str | os.PathLike[str], st: os.stat_result | None = None) -> os.stat_result:
        """Refuse ``path`` unless it may be trusted; returns its ``lstat``.

        Raises:
            RendezvousStateError: naming the path, its owner and what to do.
        """
        st = os.lstat(path) if st is None else st
        why = self.problem(st)
        if why is not None:
            what = "directory" if stat.S_ISDIR(st.st_mode) else "file"
            raise RendezvousStateError(
                f"refusing rendezvous {what} {os.fspath(path)}: it {why}. Another user could join or read this "
                "job through it. Use another rendezvous.options.path or run_id; if the file is yours, remove the "
                f"run directory or 'chmod go-w' it ({_DOCS})"
            )
        return st

    def check_tree(self, root: Path) -> None:
        """:meth:`check` ``root`` and everything under it (without following symbolic links)."""
        self.check(root)
        pending = [os.fspath(root)]
        while pending:
            directory = pending.pop()
            try:
                entries = list(os.scandir(directory))
            except FileNotFoundError:
                continue
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # a temporary file renamed meanwhile
                self.check(entry.path, st)
                if stat.S_ISDIR(st.st_mode):
                    pending.append(entry.path)

    def check_base(self, base: Path) -> None:
        """Refuse a ``path`` in which other users could replace the run directory.

        Raises:
            RendezvousStateError: ``base`` is not a directory, or every user may write it and it
                has no sticky bit.
        """
        st = os.stat(base)
        if not stat.S_ISDIR(st.st_mode):
            raise RendezvousStateError(f"rendezvous.options.path {base} is not a directory")
        mode = stat.S_IMODE(st.st_mode)
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            raise RendezvousStateError(
                f"refusing rendezvous.options.path {base}: every user may write it (mode {mode:04o}) and it has "
                f"no sticky bit, so another user could replace a run directory in it. 'chmod +t' or "
                f"'chmod o-w' it, or use another path ({_DOCS})"
            )

    def make_dir(self, path: Path) -> bool:
        """Create ``path`` with :attr:`dir_mode` (group-owned when sharing); ``False`` if it existed.

        Raises:
            OSError: it could not be created.
        """
        try:
            os.mkdir(path, self.dir_mode)
        except FileExistsError:
            return False
        if self.gid is not None:
            os.chown(path, -1, self.gid)
            os.chmod(path, self.dir_mode)  # past the umask; chown may have cleared set-group-id
        return True

    def make_dirs(self, path: Path) -> None:
        """Create ``path`` and its missing parents with :attr:`dir_mode`.

        Raises:
            OSError: one could not be created.
        """
        missing: list[Path] = []
        while not path.exists():
            missing.append(path)
            if path.parent == path:
                break
            path = path.parent
        for directory in reversed(missing):
            self.make_dir(directory)

    def fix_file(self, fd: int) -> None:
        """Give a file just created on ``fd`` :attr:`file_mode` past the umask (when sharing)."""
        if self.gid is not None:
            os.fchmod(fd, self.file_mode)
