"""Opening a run directory of the file backend: creating it, or finding an existing one.

Everything is created private (see :mod:`rallypoint_file.trust`); the ``FORMAT`` file marks
the directory as ours.

A new run directory gets its lock file (created whole, ``O_EXCL``), then, under the lock, the
revision counter with the directory's random nonce and the ``FORMAT`` file. An existing one must
carry a ``FORMAT`` of this run id and version; a directory holding anything else is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError
from rallypoint_file.integrity import RunIntegrity
from rallypoint_file.layout import FORMAT, REV_WIDTH, RunPaths, read_bytes
from rallypoint_file.revisions import RevisionLock
from rallypoint_file.state_files import atomic_write, read_json
from rallypoint_file.trust import Trust

__all__ = ["check_format", "create", "init_format", "open_existing"]


def create(paths: RunPaths, trust: Trust) -> None:
    """Create (or check) the base directory, the run directory, ``kv/`` and the lock file."""
    where: Path = paths.base
    try:
        trust.make_dirs(paths.base)
        trust.check_base(paths.base)
        for where in (paths.root, paths.kv):
            trust.make_dir(where)
        where = paths.lock
        with contextlib.suppress(FileExistsError):
            fd = os.open(str(paths.lock), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, trust.file_mode)
            try:
                trust.fix_file(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        raise RendezvousBackendError(f"cannot create rendezvous directory or file {where}: {exc}") from exc
    trust.check_tree(paths.root)


def open_existing(paths: RunPaths, trust: Trust, integrity: RunIntegrity) -> None:
    """Read-only: check an existing run directory and its FORMAT; create nothing."""
    if not paths.root.is_dir():
        raise RendezvousStateError(
            f"no rendezvous state for run {paths.run_id!r}: no rendezvous directory {paths.root} (no job with "
            f"that run id has used rendezvous.options.path {paths.base}); check the path and the run id"
        )
    trust.check_base(paths.base)
    trust.check_tree(paths.root)
    try:
        integrity.parse_lock(read_bytes(str(paths.lock)))
    except FileNotFoundError:
        raise RendezvousStateError(f"{paths.root} has no lock file: not a rallypoint rendezvous directory") from None
    check_format(paths, read_json(str(paths.format), paths.root))


def init_format(paths: RunPaths, trust: Trust, lock: RevisionLock) -> None:
    """Under the lock: write the counter, the nonce and ``FORMAT`` of a new run directory, or check them."""
    integrity = lock.integrity
    with lock.locked() as fd:
        if not paths.format.exists():
            others = [p.name for p in paths.root.iterdir() if p.name not in ("kv", "lock", "FORMAT")]
            if others or any(paths.kv.iterdir()):
                raise RendezvousStateError(
                    f"{paths.root} is not a rallypoint rendezvous directory (it has no FORMAT file but holds "
                    f"{sorted(others) or 'files under kv/'}); choose another rendezvous.options.path or run_id"
                )
            nonce = secrets.token_hex(16).encode()
            try:
                os.pwrite(fd, b"%*d %s" % (REV_WIDTH, 0, nonce), 0)
            except OSError as exc:
                raise RendezvousBackendError(f"cannot write the revision counter {paths.lock}: {exc}") from exc
            integrity.nonce = nonce
            atomic_write(str(paths.format), json.dumps({**FORMAT, "run_id": paths.run_id}), trust)
            return
        check_format(paths, read_json(str(paths.format), paths.root))
        integrity.parse_lock(os.pread(fd, 64, 0))


def check_format(paths: RunPaths, data: Any) -> None:
    """Refuse a ``FORMAT`` of another kind of directory, another run, or another version."""
    fmt = paths.format
    if not isinstance(data, dict) or data.get("format") != FORMAT["format"] or data.get("run_id") != paths.run_id:
        raise RendezvousStateError(
            f"{fmt} does not describe a rallypoint-file rendezvous of run {paths.run_id!r} (found {data!r}); "
            f"choose another rendezvous.options.path or delete the directory"
        )
    if data.get("version") != FORMAT["version"]:
        raise RendezvousStateError(
            f"{fmt} has format version {data.get('version')!r}; this rallypoint-file reads version "
            f"{FORMAT['version']}: use the same rallypoint-file on every node, and a new run_id"
        )
