"""The agent's side of the warm process: start it, ask it for workers, follow their exits.

:class:`WarmLauncher` owns one warm process at a time (:mod:`rallypoint.agent.warm._server`),
started with the agent's parent-death signal and in a session of its own. Each worker it forks
comes back as a :class:`WarmProcess`, a handle with the parts of :class:`subprocess.Popen`'s
interface the agent uses (``pid``, ``args``, ``stdout``, ``stderr``, ``returncode``, ``poll``,
``wait``, ``send_signal``, ``terminate``, ``kill``), plus :meth:`WarmProcess.wait_no_reap`.

The workers are the warm process's children, not the agent's: their exit status reaches the
agent as a message, and each stays a zombie in the warm process (keeping its pid and process
group) until the agent reaps it, exactly as :class:`rallypoint.agent.workers.WorkerGroup` does
with its own children. If the warm process dies, its workers die with it (their parent-death
signal), their handles report ``SIGKILL``, and the next :meth:`WarmLauncher.spawn` starts a new
warm process.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TextIO

from rallypoint.agent import console, worker_main
from rallypoint.agent.death_signal import PDEATHSIG_SUPPORTED, make_preexec
from rallypoint.agent.spawner import spawner
from rallypoint.agent.warm import _server
from rallypoint.agent.warm import keep as kept
from rallypoint.core.errors import EXIT_USAGE, RallypointError

__all__ = ["WarmLauncher", "WarmProcess", "WarmRefusedError", "preload_problem", "warm_environment"]

#: The warm process's program, run by path (it imports nothing of rallypoint).
SERVER = str(Path(_server.__file__).resolve())
#: Seconds the warm process may take to import the preloaded modules.
READY_TIMEOUT = 600.0
#: Seconds to wait for an answer to one spawn request.
SPAWN_TIMEOUT = 60.0


class _WarmGone(OSError):
    """The warm process ended before it answered a spawn request."""


class WarmRefusedError(RallypointError):
    """The warm process cannot fork workers: a preloaded module failed or is unsafe to fork after."""

    exit_code = EXIT_USAGE


def preload_problem(argv: Sequence[str]) -> str | None:
    """Why workers with command line ``argv`` cannot be forked from a warm process, or ``None``."""
    try:
        worker_main.parse_argv(argv)
    except ValueError:
        return f"preloading needs a Python script or module to run, but the workers run {argv[0]!r} as a program"
    return None


def warm_environment(base: Mapping[str, str], extra: Mapping[str, str], local_world_size: int) -> dict[str, str]:
    """The warm process's environment: what every local worker shares, before the per-rank variables.

    The agent's environment and the job's variables, plus the defaults the workers get (one
    OpenMP thread per worker when several share the node: libraries read it as they load).
    """
    env = {**base, **extra}
    if local_world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class WarmProcess:
    """A worker forked by the warm process, with the :class:`subprocess.Popen` interface the agent uses."""

    def __init__(self, conn: _Connection, pid: int, args: Sequence[str]) -> None:
        self._conn = conn
        self.pid = pid
        self.args = list(args)
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        #: The exit status once reaped (``-N`` for signal N), else ``None``, as for ``Popen``.
        self.returncode: int | None = None
        self._status: int | None = None
        self._reaped_elsewhere = False
        self._exited = threading.Event()

    def _set_exit(self, returncode: int, *, reaped: bool = False) -> None:
        if self._exited.is_set():
            return
        self._status = returncode
        self._reaped_elsewhere = reaped
        if reaped:
            self.returncode = returncode
        self._exited.set()

    def wait_no_reap(self, timeout: float | None = None) -> int | None:
        """Block until the worker exits; return its status, leaving it a zombie (``None`` on timeout)."""
        if not self._exited.wait(timeout):
            return None
        return self._status

    def poll(self) -> int | None:
        """The exit status if the worker ended (reaping it), else ``None``."""
        if self._exited.is_set():
            self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the worker's exit and reap it.

        Raises:
            subprocess.TimeoutExpired: it is still running after ``timeout`` seconds.
        """
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self._reap()
        assert self.returncode is not None
        return self.returncode

    def _reap(self) -> None:
        if self.returncode is None and self._status is not None:
            self.returncode = self._status
            if not self._reaped_elsewhere:
                self._conn.reap(self.pid)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the worker unless it was reaped."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        """Send ``SIGTERM``."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Send ``SIGKILL``."""
        self.send_signal(signal.SIGKILL)


def _gone(pid: int, deadline: float) -> None:
    """Wait until ``pid`` no longer exists (killed with its warm process, reaped by init)."""
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.005)


class _Connection:
    """One warm process (started here, or a kept one found running) and the thread that reads its messages."""

    def __init__(
        self, modules: Sequence[str], env: Mapping[str, str], python: str, pdeathsig: bool, keep: float = 0.0
    ) -> None:
        self.modules = list(modules)
        self.pdeathsig = pdeathsig
        self.sock: socket.socket | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        #: The warm process's pid (``None`` until known: a kept one is found or started by the reader).
        self.server_pid: int | None = None
        self.kept = False  # the warm process outlives this agent (preload_keep)
        self.attached = False  # ... and was found running, started by another agent
        self.log: Path | None = None
        self._send_lock = threading.Lock()
        self._state = threading.Condition()
        self.ready = False
        self.refused: str | None = None
        self.stale: str | None = None
        self.dead = False
        self.closing = False
        self.ready_seconds: float | None = None
        self._next_id = 0
        self._pending: dict[int, tuple[concurrent.futures.Future[WarmProcess], list[str]]] = {}
        self._handles: dict[int, WarmProcess] = {}
        if keep > 0:
            target: Any = self._keep_then_read
            args: tuple[Any, ...] = (env, python, keep)
        else:
            self.sock, target, args = self._start(python, env, pdeathsig), self._read, ()
        threading.Thread(target=target, args=args, name="rallypoint-warm-reader", daemon=True).start()

    def _start(
        self, python: str, env: Mapping[str, str], pdeathsig: bool, options: Sequence[str] = (), log: Path | None = None
    ) -> socket.socket:
        """Start a warm process connected to the socket returned."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [python, "-u", SERVER, str(theirs.fileno()), *options, *self.modules]
        try:
            self.popen = _start_server(argv, env, theirs.fileno(), pdeathsig, log)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.server_pid = self.popen.pid
        return ours

    def _keep_then_read(self, env: Mapping[str, str], python: str, keep: float) -> None:
        """Reader thread of a kept warm process: find or start it, then read its messages."""
        try:
            sock, first = self._find_or_start(env, python, keep)
        except Exception as exc:  # noqa: BLE001 - reported by wait_ready, as a warm process that ended
            console.message(f"rallypoint: cannot start the warm process: {exc}\n")
            self._lost()
            return
        with self._state:
            self.sock = sock
            closing = self.closing
        if closing:
            sock.close()
        elif first is not None:
            self._dispatch(first[0])
            for fd in first[1]:
                os.close(fd)
            self._read()
            return
        self._lost()

    def _find_or_start(
        self, env: Mapping[str, str], python: str, keep: float
    ) -> tuple[socket.socket, tuple[dict[str, Any], list[int]] | None]:
        """Connect to the kept warm process of this key, or start it; the socket and its first message."""
        try:
            directory = kept.secure_runtime_dir()
            key = kept.reuse_key(python, self.modules, env)
            path = kept.socket_path(directory, key)
        except (OSError, kept.KeepDirectoryError) as exc:
            console.message(f"rallypoint: agent.preload_keep: {exc}\n")
            sock = self._start(python, env, self.pdeathsig)
            return sock, _server.recv(sock)
        with kept.key_lock(directory, key, READY_TIMEOUT) as locked:
            found = self._hello(path) if locked else None
            if found is not None:
                return found
            self.kept, self.log = True, kept.log_path(directory, key)
            sock = self._start(python, env, False, ["--keep", f"{keep:g}", "--listen", os.fspath(path)], self.log)
            return sock, _server.recv(sock)  # ready (listening) or refused, before the lock is released

    def _hello(self, path: Path) -> tuple[socket.socket, tuple[dict[str, Any], list[int]]] | None:
        """Attach to the kept warm process at ``path`` if it is there and not stale."""
        sock = kept.connect(path)
        if sock is None:
            with contextlib.suppress(OSError):
                path.unlink()  # nothing listens there: a warm process that was killed
            return None
        try:
            _server.send(sock, {"op": "hello"})
        except OSError:
            sock.close()
            return None
        answer = _server.recv(sock)
        if answer is None or answer[0].get("op") != "ready":
            if answer is not None and answer[0].get("op") == "stale":
                console.message(
                    f"rallypoint: the kept warm process is stale ({answer[0].get('message')}); starting a new one\n"
                )
            sock.close()
            return None
        sock.settimeout(None)
        self.kept = self.attached = True
        return sock, answer

    # -- reading -----------------------------------------------------------------------------------
    def _read(self) -> None:
        assert self.sock is not None
        while (received := _server.recv(self.sock)) is not None:
            self._dispatch(received[0])
            for fd in received[1]:
                os.close(fd)
        self._lost()

    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        with self._state:
            if op == "ready":
                self.ready, self.ready_seconds = True, float(message.get("seconds", 0.0))
                self.server_pid = int(message.get("pid", self.server_pid or 0)) or self.server_pid
            elif op == "refused":
                self.refused = str(message.get("message"))
            elif op in ("spawned", "failed"):
                future, argv = self._pending.pop(int(message["id"]))
                if op == "spawned":
                    handle = WarmProcess(self, int(message["pid"]), argv)
                    self._handles[handle.pid] = handle
                    future.set_result(handle)
                elif message.get("stale"):  # a kept warm process whose modules changed: replaced by the launcher
                    self.stale = str(message["message"])
                    future.set_exception(_WarmGone(0, self.stale))
                else:
                    future.set_exception(OSError(int(message["errno"]) or None, str(message["message"])))
            elif op == "exit":
                exited = self._handles.pop(int(message["pid"]), None)
                if exited is not None:
                    exited._set_exit(int(message["returncode"]))
            self._state.notify_all()

    def _lost(self) -> None:
        """End of file: the warm process is gone; so are its workers (parent-death signal)."""
        with self._state:
            self.dead = True
            live = list(self._handles.values())
            self._handles.clear()
            for future, _argv in self._pending.values():
                future.set_exception(_WarmGone(0, "the warm process ended while starting the worker"))
            self._pending.clear()
            self._state.notify_all()
        deadline = time.monotonic() + 10.0
        for handle in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(handle.pid, signal.SIGKILL)  # no-op with a death signal; needed without one
        for handle in live:
            _gone(handle.pid, deadline)
            handle._set_exit(-int(signal.SIGKILL), reaped=True)

    # -- requests ----------------------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> None:
        with self._state:
            self._state.wait_for(lambda: self.ready or self.refused is not None or self.dead, timeout)
            if self.refused is not None:
                raise WarmRefusedError(f"agent.preload: {self.refused}")
            if not self.ready:
                why = "ended" if self.dead else f"was not ready after {timeout:g} s"
                where = f"in {self.log}" if self.log is not None else "above"
                raise RallypointError(
                    f"the warm process (pid {self.server_pid}) that preloads {', '.join(self.modules)} {why} "
                    f"before its first worker; its error output is {where}. Check that each module of "
                    "agent.preload imports on its own (python -c 'import NAME')"
                )

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, fds: list[int], pdeathsig: bool
    ) -> WarmProcess:
        future: concurrent.futures.Future[WarmProcess] = concurrent.futures.Future()
        with self._state:
            if self.dead:
                raise _WarmGone(0, "the warm process ended")
            self._next_id += 1
            request_id = self._next_id
            self._pending[request_id] = (future, list(argv))
        request = {"op": "spawn", "id": request_id, "argv": list(argv), "env": dict(env), "cwd": cwd}
        request["pdeathsig"] = pdeathsig
        try:
            assert self.sock is not None  # ready
            with self._send_lock:
                _server.send(self.sock, request, fds)
        except OSError as exc:
            with self._state:
                self._pending.pop(request_id, None)
            raise _WarmGone(exc.errno or 0, f"the warm process is gone ({exc})") from exc
        return future.result(SPAWN_TIMEOUT)

    def wait_gone(self, timeout: float) -> None:
        """Wait until the reader thread has seen the end of the warm process."""
        with self._state:
            self._state.wait_for(lambda: self.dead, timeout)

    def reap(self, pid: int) -> None:
        if self.sock is None:
            return
        with contextlib.suppress(OSError), self._send_lock:
            _server.send(self.sock, {"op": "reap", "pid": pid})

    def close(self, timeout: float = 5.0) -> None:
        """End this connection; a warm process not kept is stopped, a kept one stays for the next agent."""
        with self._state:
            self.closing = True
            sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a kept warm process kills what is left of ours
        if self.kept or self.popen is None:
            if self.popen is not None:
                self.popen.poll()  # reaped if it already exited; otherwise it outlives us
        else:
            if not self.ready:  # still importing (a signal stopped the agent early): nothing to wait for
                with contextlib.suppress(OSError):
                    self.popen.kill()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if sock is not None:
            sock.close()


def _start_server(
    argv: list[str], env: Mapping[str, str], fd: int, pdeathsig: bool, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start the warm process from the agent's spawner thread (the death signal follows that thread).

    A kept one (``log`` given) writes its error output there and runs in ``/``: it outlives the
    agent, its terminal and its working directory.
    """

    def start() -> subprocess.Popen[bytes]:
        preexec = make_preexec(os.getpid()) if pdeathsig and PDEATHSIG_SUPPORTED else None
        with open(log, "wb") if log is not None else contextlib.nullcontext() as stderr:
            return subprocess.Popen(
                argv,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd="/" if log is not None else None,
                pass_fds=(fd,),
                start_new_session=True,
                preexec_fn=preexec,
            )

    return spawner.call(start)


class WarmLauncher:
    """Starts workers by forking them from a warm process that has imported ``modules``.

    Args:
        modules: the modules to import once (``[agent] preload``); none makes the launcher inert.
        env: the warm process's environment (see :func:`warm_environment`); the agent's by default.
        python: the interpreter; the agent's by default.
        console: where messages about the warm process go (``sys.stderr`` by default).
        pdeathsig: the warm process dies with the agent (Linux parent-death signal).
        keep: seconds the warm process stays after the agent, for the next agent of this user
            with the same interpreter, modules and environment (``[agent] preload_keep``;
            :mod:`rallypoint.agent.warm.keep`). 0: it ends with the agent.
    """

    def __init__(
        self,
        modules: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        python: str | None = None,
        console: TextIO | None = None,
        pdeathsig: bool = True,
        keep: float = 0.0,
    ) -> None:
        self.modules = list(modules)
        self.keep = keep
        self.env = dict(os.environ if env is None else env)
        self.python = python or sys.executable
        self.console = console
        self.pdeathsig = pdeathsig
        #: How many warm processes were started (more than one after one died).
        self.starts = 0
        self._conn: _Connection | None = None
        self._retired: list[_Connection] = []  # stale kept warm processes, still running workers of ours
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The current warm process's pid, or ``None`` before it is known."""
        return self._conn.server_pid if self._conn is not None else None

    @property
    def attached(self) -> bool:
        """Whether the current warm process is a kept one that another agent started."""
        return self._conn is not None and self._conn.attached

    @property
    def ready_seconds(self) -> float | None:
        """How long the current warm process took to import the modules, once ready."""
        return self._conn.ready_seconds if self._conn is not None else None

    def start(self) -> None:
        """Start the warm process unless one is running; returns at once (the imports go on).

        Does nothing without modules to preload: such a launcher is inert, and a
        :class:`~rallypoint.agent.workers.WorkerGroup` given it starts fresh interpreters.
        """
        if not self.modules:
            return
        with self._lock:
            self._ensure()

    def wait_ready(self) -> None:
        """Block until the warm process has imported its modules (starting one if none runs).

        :meth:`spawn` waits the same way first; a caller that must stay interruptible while the
        imports run (the agent's main thread, for signals) waits here, and the spawn that follows
        is short.

        Raises:
            WarmRefusedError: a preloaded module failed to import or made forking unsafe.
            RallypointError: the warm process died, or was not ready in time.
        """
        if not self.modules:
            return
        with self._lock:
            conn = self._ensure()
        conn.wait_ready(READY_TIMEOUT)

    def _ensure(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.dead and conn.stale is None:
            return conn
        if conn is not None and conn.stale is not None:
            self._retired.append(conn)  # it exits once we close: our workers forked from it run on
            self._say(f"the kept warm process (pid {conn.server_pid}) is stale ({conn.stale}); starting a new one")
        elif conn is not None:
            if conn.refused is not None:
                raise WarmRefusedError(f"agent.preload: {conn.refused}")
            how = ""
            if conn.popen is not None and not conn.attached:
                code = conn.popen.wait()
                how = f" ({f'signal {signal.Signals(-code).name}' if code < 0 else f'exit code {code}'})"
            self._say(f"the warm process (pid {conn.server_pid}) ended{how}; starting a new one")
            if conn.sock is not None:
                conn.sock.close()
        self._conn = _Connection(self.modules, self.env, self.python, self.pdeathsig, self.keep)
        self.starts += 1
        return self._conn

    def _say(self, what: str) -> None:
        console.message(f"rallypoint: {what} (importing {', '.join(self.modules)} again)\n", self.console)

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdout: int = 1,
        stderr: int = 2,
        pdeathsig: bool = True,
    ) -> WarmProcess:
        """Fork one worker: ``argv`` is ``[python, -u, script, ...]`` or ``[python, -u, -m, module, ...]``.

        ``stdout`` and ``stderr`` are descriptors the worker gets as its 1 and 2 (the caller keeps
        its own copies); its stdin is ``/dev/null``. ``env`` is its complete environment. A warm
        process found dead, or dying under the request, is replaced and the request made once more.

        Raises:
            WarmRefusedError: a preloaded module failed to import or made forking unsafe.
            OSError: the worker could not be set up (e.g. no such working directory).
            RallypointError: the warm process died before it was ready.
        """
        environ = dict(os.environ if env is None else env)
        for retry in (False, True):
            with self._lock:
                conn = self._ensure()
            conn.wait_ready(READY_TIMEOUT)
            try:
                return conn.spawn(argv, environ, os.fspath(cwd or os.getcwd()), [stdout, stderr], pdeathsig)
            except _WarmGone:
                if retry:  # a second warm process died under this request too: give up
                    raise
                if conn.stale is None:
                    conn.wait_gone(5.0)  # the next _ensure() then starts a new one
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Stop the warm process, or leave a kept one for the next agent (its workers must have been stopped)."""
        with self._lock:
            conn, self._conn = self._conn, None
            retired, self._retired = self._retired, []
        for old in [*retired, *([conn] if conn is not None else [])]:
            old.close()
