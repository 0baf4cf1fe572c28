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

The rules themselves are :class:`rallypoint.core.file_trust.FileTrust`'s, which the agent applies
to its log directory too; this module adds the backend's group option and its errors.
"""

from __future__ import annotations

import grp
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from rallypoint.core.file_trust import FileTrust, group_name, user_name
from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError

__all__ = ["Trust"]

_DOCS = "see the security page of the rallypoint docs"
_GROUP_OPTION = "rendezvous.options.group"


@dataclass(frozen=True)
class Trust(FileTrust):
    """Whose files a run directory may hold, and the modes the backend creates files with.

    Attributes:
        uid: the current (effective) user.
        gid: the group named in ``[rendezvous.options] group``; ``None`` when none is named.
    """

    group_setting: str | None = _GROUP_OPTION

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
                f"{_GROUP_OPTION}: there is no group {group!r} on this host; name a group every "
                "node's user belongs to, or remove the option to keep the run directory private"
            ) from None
        if uid != 0 and gid != os.getegid() and gid not in os.getgroups():
            raise RendezvousBackendError(
                f"{_GROUP_OPTION} = {group!r}: the current user ({user_name(uid)}) is not a member "
                f"of {group_name(gid)}; files it creates could not be given that group"
            )
        return cls(uid, gid)

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
        for path, st in self.tree(root):
            self.check(path, st)

    def check_base(self, base: Path) -> None:
        """Refuse a ``path`` in which other users could replace the run directory.

        Raises:
            RendezvousStateError: ``base`` is not a directory, or every user may write it and it
                has no sticky bit.
        """
        st = os.stat(base)
        if not stat.S_ISDIR(st.st_mode):
            raise RendezvousStateError(f"rendezvous.options.path {base} is not a directory")
        why = self.base_problem(st)
        if why is not None:
            raise RendezvousStateError(
                f"refusing rendezvous.options.path {base}: {why}, so another user could replace a run directory "
                f"in it. 'chmod +t' or 'chmod o-w' it, or use another path ({_DOCS})"
            )
