"""The file backend on a directory other users can reach: only the owner (or a named group) joins.

The tests run as root (as CI does) and use a real second user, uid 65534 (``nobody``): files are
given to it with ``os.chown``, and child processes run as it with ``os.setuid``.
"""

from __future__ import annotations

import grp
import json
import multiprocessing
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousError, RendezvousStateError
from rallypoint_file.backend import FORMAT, FileBackend

NOBODY = 65534
NOGROUP = 65534


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory like ``/tmp``: every user may create entries (mode 1777), and reach it."""
    path = Path(tempfile.mkdtemp(prefix="rallypoint-shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def _as_nobody(func: Callable[..., Any], args: tuple[Any, ...], out: Any) -> None:
    try:
        os.setgroups([])
        os.setgid(NOGROUP)
        os.setuid(NOBODY)
        out.put(("ok", func(*args)))
    except BaseException as exc:  # noqa: BLE001 - the parent asserts on it
        out.put((type(exc).__name__, str(exc)))


def as_nobody(func: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """Run ``func(*args)`` in a child process as uid/gid 65534; ``("ok", result)`` or ``(error type, message)``."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_as_nobody, args=(func, args, out))
    child.start()
    result = out.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert isinstance(result, tuple)
    return result


def plant_world_writable_run(base: str, run_id: str) -> str:
    """What the other user did: a complete, valid-looking run directory anyone may write."""
    os.umask(0)
    root = os.path.join(base, run_id)
    os.makedirs(os.path.join(root, "kv", "round"), mode=0o777)
    with open(os.path.join(root, "FORMAT"), "w") as f:
        json.dump({**FORMAT, "run_id": run_id}, f)
    with open(os.path.join(root, "lock"), "w") as f:
        f.write(f"{0:>20d} {'0' * 32}")  # a counter and a nonce
    for name in ("FORMAT", "lock"):
        os.chmod(os.path.join(root, name), 0o666)
    return root


def open_backend(base: str, run_id: str) -> str:
    backend = FileBackend(base, run_id)
    backend.set("join/0/intruder", {"host": "evil"})
    return "joined"


def test_a_run_directory_planted_by_another_user_is_refused(shared: Path) -> None:
    status, root = as_nobody(plant_world_writable_run, str(shared), "job")
    assert status == "ok"
    assert os.stat(root).st_uid == NOBODY
    with pytest.raises(RendezvousStateError) as err:
        FileBackend(shared, "job")
    message = str(err.value)
    assert f"refusing rendezvous directory {root}" in message
    assert "owned by uid 65534 (nobody)" in message
    assert not (Path(root) / "kv" / "join").exists()  # nothing of ours went in


def test_another_user_cannot_open_or_join_a_run(shared: Path) -> None:
    backend = FileBackend(shared, "job")
    backend.set("round/header", {"round": 0})
    status, message = as_nobody(open_backend, str(shared), "job")
    assert status in ("RendezvousStateError", "RendezvousBackendError")
    assert str(shared / "job") in message
    assert backend.list("join/") == {}


def test_a_world_writable_file_in_our_run_directory_is_refused(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "job")
    backend.set("round/header", {"round": 0})
    header = backend._file("round/header")
    header.chmod(0o666)
    with pytest.raises(RendezvousStateError, match=f"refusing rendezvous file {header}: it is writable by every user"):
        FileBackend(tmp_path, "job")


def test_a_file_of_another_user_in_our_run_directory_is_refused(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "job")
    backend.set("hb/node-1", 1)
    beat = backend._file("hb/node-1")
    os.chown(beat, NOBODY, NOGROUP)
    with pytest.raises(RendezvousStateError) as err:
        FileBackend(tmp_path, "job")
    assert f"refusing rendezvous file {beat}: it is owned by uid 65534 (nobody)" in str(err.value)


@pytest.mark.parametrize("name", ["lock", "FORMAT", "kv"])
def test_group_writable_state_is_refused_unless_the_group_is_named(tmp_path: Path, name: str) -> None:
    FileBackend(tmp_path, "job")
    path = tmp_path / "job" / name
    os.chown(path, -1, NOGROUP)
    path.chmod(0o770 if path.is_dir() else 0o660)
    with pytest.raises(RendezvousStateError, match=f"{path}: it is writable by group gid 65534"):
        FileBackend(tmp_path, "job")
    FileBackend(tmp_path, "job", group=grp.getgrgid(NOGROUP).gr_name)  # named: accepted


def test_everything_is_created_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        backend = FileBackend(tmp_path / "new" / "base", "job")
        backend.set("round/header", {"round": 0})
        backend.add("round/count/0", 1)
        backend.set("k", "v")
    finally:
        os.umask(old)
    for path in [tmp_path / "new", tmp_path / "new" / "base", *(tmp_path / "new").rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {mode:04o}"


def test_a_named_group_shares_the_run_directory(shared: Path) -> None:
    group = grp.getgrgid(NOGROUP).gr_name
    backend = FileBackend(shared, "job", group=group)
    backend.set("round/header", {"round": 0})
    for path in [shared / "job", *(shared / "job").rglob("*")]:
        st = path.lstat()
        assert st.st_gid == NOGROUP, path
        assert stat.S_IMODE(st.st_mode) == (0o2770 if path.is_dir() else 0o660), path
    status, _ = as_nobody(shared_join, str(shared), "job", group)  # a member of the group joins
    assert status == "ok"
    joined = backend.get("join/0/member")
    assert joined is not None
    assert joined.value == {"host": "friend"}
    FileBackend(shared, "job", group=group)  # its files (owned by nobody, group nogroup) are accepted
    with pytest.raises(RendezvousStateError, match=r"gid 65534 \(nogroup\).*rendezvous.options.group does not name"):
        FileBackend(shared, "job")  # without the group, the group's directory is not trusted


def shared_join(base: str, run_id: str, group: str) -> str:
    FileBackend(base, run_id, group=group).set("join/0/member", {"host": "friend"})
    return "joined"


def test_an_unknown_group_is_named(tmp_path: Path) -> None:
    with pytest.raises(RendezvousBackendError, match="there is no group 'no-such-group-here'"):
        FileBackend(tmp_path, "job", group="no-such-group-here")


def test_a_base_directory_anyone_may_rewrite_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "open"
    base.mkdir()
    base.chmod(0o777)
    with pytest.raises(RendezvousStateError, match=f"refusing rendezvous.options.path {base}: every user may write"):
        FileBackend(base, "job")
    base.chmod(0o1777)  # the sticky bit: others cannot replace our run directory
    FileBackend(base, "job")


def test_a_symlinked_run_directory_is_refused(tmp_path: Path) -> None:
    FileBackend(tmp_path, "real")
    (tmp_path / "job").symlink_to(tmp_path / "real")
    with pytest.raises(RendezvousError, match=f"{tmp_path / 'job'}.*symbolic link"):
        FileBackend(tmp_path, "job")
