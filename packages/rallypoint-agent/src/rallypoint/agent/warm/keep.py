"""Kept warm processes (``[agent] preload_keep``): where they listen, which one an agent may reuse.

A kept warm process listens on a Unix socket in a directory of the user's own
(``$XDG_RUNTIME_DIR/rallypoint``, else ``/tmp/rallypoint-<uid>``), created with mode ``0700``
and refused if anyone else owns it or may enter it. The socket's name is a hash of everything
that a worker forked from the process inherits and that rallypoint does not set per worker
(:func:`reuse_key`): an agent reuses a warm process only if a fresh one it would start itself
would be the same. Agents of one key take a lock on it while they connect or start one, so that
concurrent agents of a node share one warm process instead of each importing the modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import resource
import socket
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rallypoint.agent import worker_main
from rallypoint.agent.warm import _server
from rallypoint.core.errors import RallypointError

__all__ = [
    "KeepDirectoryError",
    "kept_servers",
    "reuse_key",
    "runtime_dir",
    "secure_runtime_dir",
    "socket_path",
    "stop_kept",
]

#: Bumped when the protocol between an agent and a kept warm process changes (3: a worker's command
#: line names rallypoint.agent.worker_main before its script).
PROTOCOL = 3
#: Variables a shell changes between commands, that no library reads at import: not in the key.
VOLATILE_ENV = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
#: Seconds to wait for a kept warm process to answer ``hello``, ``info`` or ``stop``.
ANSWER_TIMEOUT = 10.0
_MAX_SOCKET_PATH = 108  # sun_path, with its terminating NUL


class KeepDirectoryError(RallypointError):
    """The directory of kept warm processes is not private to this user."""


def runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/rallypoint`` when that directory is this user's, else ``/tmp/rallypoint-<uid>``."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        with contextlib.suppress(OSError):
            st = os.stat(xdg)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                return Path(xdg) / "rallypoint"
    return Path(f"/tmp/rallypoint-{os.getuid()}")  # checked to be ours and 0700 below


def secure_runtime_dir(create: bool = True) -> Path:
    """The runtime directory, created ``0700`` if needed and checked to be this user's alone.

    Raises:
        KeepDirectoryError: it is a link or not a directory, someone else owns it, or others may enter it.
        FileNotFoundError: it does not exist and ``create`` is false.
    """
    path = runtime_dir()
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise KeepDirectoryError(
            f"{path} is not a directory of this user's alone (owner uid {st.st_uid}, mode "
            f"{stat.filemode(st.st_mode)}); the warm process is not kept. Remove it, or set XDG_RUNTIME_DIR "
            "to a directory of your own"
        )
    return path


def _inherited() -> dict[str, Any]:
    """What a forked worker inherits from the warm process beyond its environment."""
    limits = {
        name: resource.getrlimit(getattr(resource, name))
        for name in sorted(dir(resource))
        if name.startswith("RLIMIT_") and isinstance(getattr(resource, name), int)
    }
    cgroup = ""
    with contextlib.suppress(OSError):
        cgroup = Path("/proc/self/cgroup").read_text()
    umask = ""
    with contextlib.suppress(OSError):
        umask = next(
            (line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("Umask")), ""
        )
    return {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": sorted(os.getgroups()),
        "limits": limits,
        "cgroup": cgroup,
        "umask": umask,
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }


def reuse_key(python: str, modules: Sequence[str], env: Mapping[str, str]) -> str:
    """The hash that names a kept warm process: equal keys, interchangeable processes.

    It covers the interpreter (its real path), the modules in order, the warm process's own
    programs (``_server.py`` and :mod:`rallypoint.agent.worker_main`: path, size and modification
    time) and protocol, the environment the modules
    are imported with (libraries read variables as they load; a few a shell changes between
    commands are left out), and what a worker inherits from it (user and groups, resource limits,
    control group, umask, CPU affinity, nice value).
    """
    programs = [os.path.realpath(path) for path in (_server.__file__, worker_main.PATH)]
    material = {
        "python": os.path.realpath(python),
        "modules": list(modules),
        "program": [[path, os.stat(path).st_size, os.stat(path).st_mtime_ns] for path in programs] + [PROTOCOL],
        "env": sorted((k, v) for k, v in env.items() if k not in VOLATILE_ENV),
        **_inherited(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def socket_path(directory: Path, key: str) -> Path:
    """Where the kept warm process of ``key`` listens.

    Raises:
        KeepDirectoryError: the path is too long for a Unix socket (108 bytes on Linux).
    """
    path = directory / f"warm-{key}.sock"
    if len(os.fsencode(path)) >= _MAX_SOCKET_PATH:
        raise KeepDirectoryError(
            f"{path} is too long for a Unix socket; the warm process is not kept. Set XDG_RUNTIME_DIR to a "
            "shorter directory of your own"
        )
    return path


@contextlib.contextmanager
def key_lock(directory: Path, key: str, timeout: float) -> Iterator[bool]:
    """Hold the lock of ``key`` while connecting to or starting its warm process; yields whether it was taken."""
    fd = os.open(directory / f"warm-{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.01)
        yield True
    finally:
        os.close(fd)


def connect(path: Path, timeout: float = ANSWER_TIMEOUT) -> socket.socket | None:
    """A connection to the kept warm process at ``path``, or ``None`` (absent, dead, another user's)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(os.fspath(path))
        if _server.peer_uid(sock) == os.getuid():
            return sock
    except OSError:
        pass
    sock.close()
    return None


def ask(path: Path, op: str) -> dict[str, Any] | None:
    """Send ``op`` to the kept warm process at ``path``; its answer, or ``None``."""
    sock = connect(path)
    if sock is None:
        return None
    with sock:
        try:
            _server.send(sock, {"op": op})
        except OSError:
            return None
        received = _server.recv(sock)
    return None if received is None else {**received[0], "socket": os.fspath(path)}


def kept_servers() -> list[dict[str, Any]]:
    """Every kept warm process of this user that answers, as its ``info`` (sockets of dead ones are removed)."""
    try:
        directory = secure_runtime_dir(create=False)
    except FileNotFoundError:
        return []
    found = []
    for path in sorted(directory.glob("warm-*.sock")):
        info = ask(path, "info")
        if info is None:
            with contextlib.suppress(OSError):
                path.unlink()  # nothing listens: a warm process that was killed
            continue
        found.append(info)
    return found


def stop_kept(pids: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Tell kept warm processes (those with ``pids``, or all) to stop; the ``stopping`` answers.

    A stopped warm process takes no new agent and exits as soon as the agents connected to it
    (running jobs) are gone.
    """
    stopped = []
    for info in kept_servers():
        if pids and info.get("pid") not in pids:
            continue
        answer = ask(Path(info["socket"]), "stop")
        if answer is not None:
            stopped.append(answer)
    return stopped


def log_path(directory: Path, key: str) -> Path:
    """Where a kept warm process's own error output goes (it outlives the agent's terminal)."""
    return directory / f"warm-{key}.log"
