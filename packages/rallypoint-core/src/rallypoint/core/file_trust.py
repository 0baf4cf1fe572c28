"""Who may have written a file: the rules that keep other users out of a private directory.

A directory that holds a job's private state (the ``file`` rendezvous backend's run directory, the
agent's log directory) and every entry in it must be

* no symbolic link (rallypoint never creates one);
* owned by the current user, or, when a group shares it, by that group;
* writable by nobody else: not by every user, and by a group only when it is the sharing group.

The directories on the way to it must not let another user replace it (:meth:`FileTrust.path_problem`),
and the directory that holds it may be shared only with a sticky bit (:meth:`FileTrust.base_problem`).
Everything rallypoint creates there gets mode ``0700``/``0600`` (``2770``/``0660`` with a group).

Example::

    >>> import os, tempfile
    >>> trust = FileTrust(os.geteuid())
    >>> private = Path(tempfile.mkdtemp())  # mode 0700, yours
    >>> trust.problem(os.lstat(private)) is None
    True
    >>> os.chmod(private, 0o777)
    >>> trust.problem(os.lstat(private))
    'is writable by every user (mode 0777)'
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FileTrust", "group_name", "user_name"]


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


def _writable_by_others(mode: int) -> bool:
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


@dataclass(frozen=True)
class FileTrust:
    """Whose files a private directory may hold, and the modes rallypoint creates files with.

    Attributes:
        uid: the current (effective) user.
        gid: the group that shares the directory; ``None`` when none does.
        group_setting: the setting that names that group, for messages (``None``: there is none).
    """

    uid: int
    gid: int | None = None
    group_setting: str | None = None

    @property
    def dir_mode(self) -> int:
        """Mode of the directories rallypoint creates."""
        return 0o700 if self.gid is None else 0o2770

    @property
    def file_mode(self) -> int:
        """Mode of the files rallypoint creates."""
        return 0o600 if self.gid is None else 0o660

    @property
    def shares(self) -> bool:
        """Whether a group shares the directory (new files need their mode set past the umask)."""
        return self.gid is not None

    def problem(self, st: os.stat_result) -> str | None:
        """Why an entry with status ``st`` (from ``lstat``) may not be trusted; ``None`` when it may."""
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
            unnamed = f", which {self.group_setting} does not name" if self.group_setting else ""
            return f"is writable by group {group_name(st.st_gid)} (mode {mode:04o}){unnamed}"
        return None

    @staticmethod
    def base_problem(st: os.stat_result) -> str | None:
        """Why a directory holding private ones (status ``st``) lets others replace them; ``None`` when it does not.

        Every user may write it and it has no sticky bit (``/tmp``-like directories, mode
        ``1777``, are fine: there only an entry's owner may rename or delete it).
        """
        mode = stat.S_IMODE(st.st_mode)
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            return f"every user may write it (mode {mode:04o}) and it has no sticky bit"
        return None

    def path_problem(self, path: Path) -> tuple[Path, str] | None:
        """The first directory on the way to ``path`` through which another user could replace it, and why.

        Checked, from ``/`` down to the parent of ``path`` (the parts that exist):

        * every directory the path leads through (after symbolic links) may be written only by
          its owner (a group or every user only with the sticky bit, or a group that is yours
          alone: named like you, your primary group, no other members);
        * an entry (directory or link) in a directory that others may write, like ``/tmp``, must
          be yours or root's: anyone could have put it there.

        The owner of a directory on the way may rename what is in it: the path is as safe as they
        are trustworthy (root, you, or whoever owns the tree you work in).
        """
        path = Path(os.path.abspath(path))
        for entry in reversed(path.parents[:-1]):
            try:
                lst, holder = os.lstat(entry), os.stat(entry.parent)
            except FileNotFoundError:
                break  # created later, by rallypoint, private
            if _writable_by_others(stat.S_IMODE(holder.st_mode)) and lst.st_uid not in (self.uid, 0):
                return entry, f"is owned by {user_name(lst.st_uid)} in a directory every user may write to"
        real = Path(os.path.realpath(path.parent))
        for directory in [*reversed(real.parents), real]:
            try:
                st = os.stat(directory)
            except FileNotFoundError:
                break
            mode = stat.S_IMODE(st.st_mode)
            if _writable_by_others(mode) and not mode & stat.S_ISVTX and not self._own_group(st, mode):
                who = "every user" if mode & stat.S_IWOTH else f"group {group_name(st.st_gid)}"
                return directory, f"is writable by {who} (mode {mode:04o}) and has no sticky bit"
        return None

    def _own_group(self, st: os.stat_result, mode: int) -> bool:
        """Whether only the group may write ``st`` besides its owner, and that group is this user's alone."""
        if mode & stat.S_IWOTH or st.st_gid != os.getegid():
            return False
        try:
            name = pwd.getpwuid(self.uid).pw_name
            group = grp.getgrgid(st.st_gid)
        except KeyError:
            return False
        return group.gr_name == name and set(group.gr_mem) <= {name}

    def tree(self, root: Path) -> Iterator[tuple[str, os.stat_result]]:
        """``root`` and everything under it, with its ``lstat``, without following symbolic links."""
        yield os.fspath(root), os.lstat(root)
        pending = [os.fspath(root)]
        while pending:
            directory = pending.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # a temporary file renamed meanwhile
                yield entry.path, st
                if stat.S_ISDIR(st.st_mode):
                    pending.append(entry.path)

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
