"""The built-in watchdog transports: ``local`` and ``file``.

``file``
    A named pipe (FIFO) in the run directory; each request is one JSON line written atomically
    (at most ``PIPE_BUF`` bytes). Workers find it through ``TORCHELASTIC_TIMER_FILE``, the variable
    torch uses, and the line format is torch's, so a worker using torch's ``FileTimerClient`` works
    against this server unchanged.
``local``
    A ``multiprocessing`` connection (an authenticated Unix socket): the multiprocessing queue of
    torch's local timer cannot be inherited by workers started with ``subprocess``, so the queue
    lives in the agent and workers reach it through ``RALLYPOINT_WATCHDOG_ADDRESS`` and
    ``RALLYPOINT_WATCHDOG_AUTHKEY``. Requests are the same JSON objects as ``file``'s.

Each backend class is what its :class:`~rallypoint.timer.records.TimerBackendRecord` names as
``factory``; the agent calls ``start_server(run_dir, options)`` on it (on the class or an instance)
with the ``[timer.options]`` that core's config resolution validated (an instance of the record's
``options_model``, see :mod:`rallypoint.timer.options`), which the backend takes as given.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import select
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rallypoint.timer.watchdog_core import (
    ENV_BACKEND,
    ENV_RANK,
    MAX_REQUEST_BYTES,
    TimerClient,
    WatchdogError,
    WatchdogServer,
    WatchdogUnavailableError,
)

__all__ = [
    "ENV_ADDRESS",
    "ENV_AUTHKEY",
    "ENV_TIMER_FILE",
    "FileTimerClient",
    "FileWatchdog",
    "FileWatchdogServer",
    "LocalTimerClient",
    "LocalWatchdog",
    "LocalWatchdogServer",
    "client_from_env",
]

#: Worker env (torch-compatible): the FIFO of the ``file`` backend.
ENV_TIMER_FILE = "TORCHELASTIC_TIMER_FILE"
#: Worker env: the socket of the ``local`` backend.
ENV_ADDRESS = "RALLYPOINT_WATCHDOG_ADDRESS"
#: Worker env: the ``local`` backend's key, hex.
ENV_AUTHKEY = "RALLYPOINT_WATCHDOG_AUTHKEY"

_UNIX_PATH_MAX = 100


if TYPE_CHECKING:
    from rallypoint.timer.options import FileOptions, LocalOptions

_O = TypeVar("_O", bound="LocalOptions")


def _given(model: type[_O], options: _O | None, backend: str) -> _O:
    """The backend's options as validated by config resolution; the model's defaults for ``None``."""
    if options is None:
        return model()
    if not isinstance(options, model):
        raise TypeError(
            f"the {backend} watchdog takes its [timer.options] as a validated {model.__name__}, "
            f"got {type(options).__name__}; build one with {model.__module__}.{model.__name__}(...)"
        )
    return options


def _rank_from_env(environ: Mapping[str, str]) -> int:
    for name in (ENV_RANK, "RANK"):
        value = environ.get(name)
        if value not in (None, ""):
            with contextlib.suppress(ValueError):
                return int(value)
    return -1


def _request(pid: int, rank: int, scope: str, expiration: float, sig: int) -> bytes:
    line = json.dumps(
        {
            "version": 1,
            "pid": pid,
            "scope_id": scope,
            "expiration_time": expiration,
            "signal": sig,
            "rank": rank,
            "acquired_at": time.time(),
        },
        separators=(",", ":"),
    ).encode()
    if len(line) >= MAX_REQUEST_BYTES:
        raise WatchdogError(f"watchdog request too large ({len(line)} bytes; scope {scope[:60]!r}...)")
    return line


# ------------------------------------------------------------------------------------------------
# file: a FIFO with JSON lines


class FileWatchdogServer(WatchdogServer):
    """The ``file`` watchdog server: reads JSON lines from a FIFO it creates."""

    def __init__(self, path: Path, *, gc_interval: float = 1.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISFIFO(self.path.lstat().st_mode):  # never delete someone's file
                raise WatchdogError(
                    f"watchdog FIFO {self.path} exists and is not a FIFO; give timer.options.path a free path"
                )
            self.path.unlink()
        os.mkfifo(self.path, 0o600)
        # O_RDWR keeps a writer open ourselves, so reads never see EOF between clients.
        self._fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        self._wake_r, self._wake_w = os.pipe()
        super().__init__(gc_interval=gc_interval)
        self._reader = threading.Thread(target=self._read, name="rallypoint-watchdog-fifo", daemon=True)
        self._reader.start()

    def worker_env(self, rank: int, pid_hint: int | None = None) -> dict[str, str]:
        """``TORCHELASTIC_TIMER_FILE`` (the FIFO), the backend name and the rank."""
        env = super().worker_env(rank, pid_hint)
        env.update({ENV_BACKEND: "file", ENV_TIMER_FILE: str(self.path)})
        return env

    def _read(self) -> None:
        pending = b""
        while self.running:
            ready, _, _ = select.select([self._fd, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    self.submit_line(line)

    def _close_transport(self) -> None:
        os.write(self._wake_w, b"x")
        self._reader.join(timeout=5)
        for fd in (self._fd, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class FileTimerClient:
    """Worker side of the ``file`` watchdog: writes one JSON line per request to the FIFO.

    The FIFO is opened once (torch's client opens it for every request) and kept open.

    Args:
        path: the FIFO (``TORCHELASTIC_TIMER_FILE``).
        rank: reported to the server; default from the environment.
        signal: what the server should send on expiry (``<= 0``: never kill).
    """

    def __init__(self, path: str | os.PathLike[str], *, rank: int | None = None, signal: int = signal.SIGKILL) -> None:
        self.path = str(path)
        self.rank = _rank_from_env(os.environ) if rank is None else rank
        self.signal = int(signal)
        self._fd: int | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _open(self) -> int:
        for _ in range(10):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno in (errno.ENXIO, errno.ENOENT):  # no reader yet / not created yet
                    time.sleep(0.1)
                    continue
                raise WatchdogUnavailableError(f"watchdog FIFO {self.path}: {exc}") from exc
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.close(fd)
                raise WatchdogUnavailableError(f"watchdog file {self.path} is not a FIFO")
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)  # block if the pipe is full
            return fd
        raise WatchdogUnavailableError(f"watchdog server is not available: nobody reads {self.path}")

    def _send(self, line: bytes) -> None:
        with self._lock:
            if self._fd is None or self._pid != os.getpid():
                self._fd, self._pid = self._open(), os.getpid()
            try:
                os.write(self._fd, line + b"\n")
            except BrokenPipeError as exc:
                os.close(self._fd)
                self._fd = None
                raise WatchdogUnavailableError(f"watchdog server is gone ({self.path})") from exc

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm ``scope_id`` to expire at ``expiration_time`` (epoch seconds)."""
        self._send(_request(os.getpid(), self.rank, scope_id, expiration_time, self.signal))

    def release(self, scope_id: str) -> None:
        """Disarm ``scope_id``."""
        self._send(_request(os.getpid(), self.rank, scope_id, -1.0, 0))

    def close(self) -> None:
        """Close the FIFO."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class FileWatchdog:
    """The ``file`` backend (a named pipe with JSON lines)."""

    @classmethod
    def start_server(cls, run_dir: Path, options: FileOptions | None = None) -> FileWatchdogServer:
        """Create the FIFO (``options.path`` or ``<run_dir>/watchdog.fifo``) and start serving.

        Args:
            run_dir: the agent's run directory.
            options: the validated ``[timer.options]``; ``None`` for the defaults.

        Raises:
            TypeError: ``options`` is not a :class:`~rallypoint.timer.options.FileOptions`.
        """
        from rallypoint.timer.options import FileOptions

        opts = _given(FileOptions, options, "file")
        path = Path(opts.path) if opts.path else Path(run_dir) / "watchdog.fifo"
        return FileWatchdogServer(path, gc_interval=opts.gc_interval)

    @staticmethod
    def client(environ: Mapping[str, str]) -> FileTimerClient:
        """The worker's client, from its environment."""
        path = environ.get(ENV_TIMER_FILE)
        if not path:
            raise WatchdogError(f"the file watchdog needs {ENV_TIMER_FILE} in the worker environment")
        return FileTimerClient(path, rank=_rank_from_env(environ))


# ------------------------------------------------------------------------------------------------
# local: a multiprocessing connection


class LocalWatchdogServer(WatchdogServer):
    """The ``local`` watchdog server: a ``multiprocessing`` listener on a Unix socket."""

    def __init__(self, address: Path, *, gc_interval: float = 1.0) -> None:
        self._tmpdir: str | None = None
        if len(str(address)) > _UNIX_PATH_MAX:
            self._tmpdir = tempfile.mkdtemp(prefix="rp-wd-")
            address = Path(self._tmpdir) / "watchdog.sock"
        address.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            address.unlink()
        self.address = address
        self.authkey = secrets.token_bytes(16)
        self._listener = Listener(str(address), family="AF_UNIX", authkey=self.authkey)
        os.chmod(address, 0o600)
        self._conns: list[Connection] = []
        super().__init__(gc_interval=gc_interval)
        self._acceptor = threading.Thread(target=self._accept, name="rallypoint-watchdog-accept", daemon=True)
        self._acceptor.start()

    def worker_env(self, rank: int, pid_hint: int | None = None) -> dict[str, str]:
        """The socket address, its key, the backend name and the rank."""
        env = super().worker_env(rank, pid_hint)
        env.update({ENV_BACKEND: "local", ENV_ADDRESS: str(self.address), ENV_AUTHKEY: self.authkey.hex()})
        return env

    def _accept(self) -> None:
        while self.running:
            try:
                conn = self._listener.accept()
            except OSError:
                if not self.running:
                    return
                continue  # a client that failed the handshake
            if not self.running:
                conn.close()
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="rallypoint-watchdog-conn", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with contextlib.suppress(EOFError, OSError):
            while self.running:
                self.submit_line(conn.recv_bytes(MAX_REQUEST_BYTES))
        with contextlib.suppress(OSError):
            conn.close()

    def _close_transport(self) -> None:
        with contextlib.suppress(OSError):  # wake the acceptor
            Client(str(self.address), family="AF_UNIX", authkey=self.authkey).close()
        self._acceptor.join(timeout=5)
        with contextlib.suppress(OSError):
            self._listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()
        with contextlib.suppress(FileNotFoundError):
            self.address.unlink()
        if self._tmpdir:
            with contextlib.suppress(OSError):
                os.rmdir(self._tmpdir)


class LocalTimerClient:
    """Worker side of the ``local`` watchdog: sends JSON requests over the agent's socket.

    Args:
        address: the socket (``RALLYPOINT_WATCHDOG_ADDRESS``).
        authkey: its key (``RALLYPOINT_WATCHDOG_AUTHKEY``, as bytes).
        rank: reported to the server; default from the environment.
        signal: what the server should send on expiry (``<= 0``: never kill).
    """

    def __init__(self, address: str, authkey: bytes, *, rank: int | None = None, signal: int = signal.SIGKILL) -> None:
        self.address = address
        self._authkey = authkey
        self.rank = _rank_from_env(os.environ) if rank is None else rank
        self.signal = int(signal)
        self._conn: Connection | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _send(self, line: bytes) -> None:
        with self._lock:
            if self._conn is None or self._pid != os.getpid():
                try:
                    self._conn = Client(self.address, family="AF_UNIX", authkey=self._authkey)
                except OSError as exc:
                    raise WatchdogUnavailableError(
                        f"watchdog server is not available at {self.address}: {exc}"
                    ) from exc
                self._pid = os.getpid()
            try:
                self._conn.send_bytes(line)
            except OSError as exc:
                self._conn = None
                raise WatchdogUnavailableError(f"watchdog server is gone ({self.address})") from exc

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm ``scope_id`` to expire at ``expiration_time`` (epoch seconds)."""
        self._send(_request(os.getpid(), self.rank, scope_id, expiration_time, self.signal))

    def release(self, scope_id: str) -> None:
        """Disarm ``scope_id``."""
        self._send(_request(os.getpid(), self.rank, scope_id, -1.0, 0))

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class LocalWatchdog:
    """The ``local`` backend (a multiprocessing connection to the agent)."""

    @classmethod
    def start_server(cls, run_dir: Path, options: LocalOptions | None = None) -> LocalWatchdogServer:
        """Listen on ``<run_dir>/watchdog.sock`` (a temporary directory if that path is too long).

        Args:
            run_dir: the agent's run directory.
            options: the validated ``[timer.options]``; ``None`` for the defaults.

        Raises:
            TypeError: ``options`` is not a :class:`~rallypoint.timer.options.LocalOptions`.
        """
        from rallypoint.timer.options import LocalOptions

        opts = _given(LocalOptions, options, "local")
        return LocalWatchdogServer(Path(run_dir) / "watchdog.sock", gc_interval=opts.gc_interval)

    @staticmethod
    def client(environ: Mapping[str, str]) -> LocalTimerClient:
        """The worker's client, from its environment."""
        address, key = environ.get(ENV_ADDRESS), environ.get(ENV_AUTHKEY)
        if not address or not key:
            raise WatchdogError(f"the local watchdog needs {ENV_ADDRESS} and {ENV_AUTHKEY} in the worker environment")
        return LocalTimerClient(address, bytes.fromhex(key), rank=_rank_from_env(environ))


def client_from_env(environ: Mapping[str, str]) -> TimerClient:
    """The client the worker environment points to.

    ``RALLYPOINT_WATCHDOG_BACKEND`` picks the transport; without it, ``TORCHELASTIC_TIMER_FILE``
    alone selects ``file`` (as under torchrun).

    Raises:
        WatchdogError: no watchdog is configured for this worker.
    """
    backend = environ.get(ENV_BACKEND) or ("file" if environ.get(ENV_TIMER_FILE) else "")
    if backend == "file":
        return FileWatchdog.client(environ)
    if backend == "local":
        return LocalWatchdog.client(environ)
    if backend:
        raise WatchdogError(f"unknown watchdog backend {backend!r} in {ENV_BACKEND}; built-in: file, local")
    raise WatchdogError(
        'no watchdog server for this worker: run it with [timer] watchdog = "local" or "file", '
        f"or set {ENV_TIMER_FILE}; or pass client= to expires()"
    )
