"""One warm process as the agent is connected to it: started here or a kept one found running.

:class:`WarmConnection` starts the warm process (:mod:`rallypoint.agent.warm._server`) from the
agent's spawner thread, with the agent's parent-death signal and in a session of its own, or
attaches to a kept one (:mod:`rallypoint.agent.warm.keep`); a thread of its own reads the warm
process's messages (ready, refused, spawned, exit). It sends spawn and reap requests. When the
warm process ends, so do its workers (parent-death signal): their handles report ``SIGKILL``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rallypoint.agent import console
from rallypoint.agent.death_signal import PDEATHSIG_SUPPORTED, make_preexec
from rallypoint.agent.spawner import spawner
from rallypoint.agent.warm import _server
from rallypoint.agent.warm import keep as kept
from rallypoint.agent.warm.forked_worker import WarmProcess
from rallypoint.core.errors import EXIT_USAGE, RallypointError

__all__ = ["READY_TIMEOUT", "SERVER", "SPAWN_TIMEOUT", "WarmConnection", "WarmGone", "WarmRefusedError"]

#: The warm process's program, run by path (it imports nothing of rallypoint).
SERVER = str(Path(_server.__file__).resolve())
#: Seconds the warm process may take to import the preloaded modules.
READY_TIMEOUT = 600.0
#: Seconds to wait for an answer to one spawn request.
SPAWN_TIMEOUT = 60.0


class WarmGone(OSError):
    """The warm process ended before it answered a spawn request."""


class WarmRefusedError(RallypointError):
    """The warm process cannot fork workers: a preloaded module failed or is unsafe to fork after."""

    exit_code = EXIT_USAGE


def _gone(pid: int, deadline: float) -> None:
    """Wait until ``pid`` no longer exists (killed with its warm process, reaped by init)."""
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.005)


class WarmConnection:
    """One warm process (started here, or a kept one found running) and the thread that reads its messages.

    Args:
        modules: the modules the warm process imports.
        env: its environment.
        python: the interpreter that runs it.
        pdeathsig: it dies with the agent (a kept one never does).
        keep: seconds a kept warm process outlives the agent; 0 starts one of its own.
    """

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
                    future.set_exception(WarmGone(0, self.stale))
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
                future.set_exception(WarmGone(0, "the warm process ended while starting the worker"))
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
        """Block until the warm process has imported its modules.

        Raises:
            WarmRefusedError: a preloaded module failed to import or made forking unsafe.
            RallypointError: the warm process ended, or was not ready within ``timeout`` seconds.
        """
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
        """Ask the warm process to fork one worker with ``fds`` as its stdout and stderr; its handle.

        Raises:
            WarmGone: the warm process ended (or is stale) before it answered.
            OSError: the warm process could not set the worker up.
        """
        future: concurrent.futures.Future[WarmProcess] = concurrent.futures.Future()
        with self._state:
            if self.dead:
                raise WarmGone(0, "the warm process ended")
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
            raise WarmGone(exc.errno or 0, f"the warm process is gone ({exc})") from exc
        return future.result(SPAWN_TIMEOUT)

    def wait_gone(self, timeout: float) -> None:
        """Wait until the reader thread has seen the end of the warm process."""
        with self._state:
            self._state.wait_for(lambda: self.dead, timeout)

    def reap(self, pid: int) -> None:
        """Let the warm process reap its exited child ``pid`` (nothing once the connection is gone)."""
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
