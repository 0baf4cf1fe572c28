"""The warm process: imports the preloaded modules once, then forks workers on the agent's request.

Run by path, never imported by the agent: ``python -u _server.py FD MODULE...``, where ``FD`` is
this end of a Unix stream socket whose other end the agent holds. It imports nothing of
rallypoint's packages (only the standard library, the modules it was asked to preload, and
:mod:`rallypoint.agent.worker_main` loaded from its file), so what a worker finds in
:data:`sys.modules` is what its script would have imported itself. A forked worker runs its
script, and ends, through :mod:`rallypoint.agent.worker_main`, as a worker the agent starts itself does.

Protocol (one JSON object per frame: a 4-byte big-endian length, then the bytes; descriptors
travel with a frame's header as ``SCM_RIGHTS``):

* server to agent, once: ``{"op": "ready", "seconds": S, "pid": P}``, or
  ``{"op": "refused", "message": M}`` and the server exits with status 2;
* agent to server: ``{"op": "spawn", "id": N, "argv": [...], "env": {...}, "cwd": C,
  "pdeathsig": B}`` with the worker's stdout and stderr descriptors; the server answers
  ``{"op": "spawned", "id": N, "pid": P}`` or ``{"op": "failed", "id": N, "errno": E,
  "message": M}``;
* server to agent: ``{"op": "exit", "pid": P, "returncode": R}`` when a worker ends
  (``R < 0``: killed by signal ``-R``); the worker stays a zombie, keeping its pid and process
  group, until the agent sends ``{"op": "reap", "pid": P}``.

The server is single-threaded (one ``selectors`` loop over its sockets and one pidfd per
worker), so forking from it never copies a lock held by another thread. When an agent's
connection ends (it closed it, or died), the workers it left are killed; a server without
``--keep`` then exits.

**Kept** (``--keep SECONDS --listen PATH``, ``[agent] preload_keep``): after the imports the
server also listens at ``PATH`` (a Unix socket in a directory only its user can enter) and
accepts any number of agents of its own user (``SO_PEERCRED``), each on its own connection with
its own workers. A connected agent first sends ``{"op": "hello"}`` and gets ``ready`` (with the
server's ``pid``, ``modules``...) or ``{"op": "stale", "message": M}``. Before answering
``hello`` and before each fork, the server checks the file of every module it has loaded; if one
changed, it answers ``stale`` (or ``failed`` with ``"stale": true``), stops listening, and exits
once its connected agents are gone, so code that changed on disk never runs in a new worker.
``{"op": "info"}`` is answered with ``info``; ``{"op": "stop"}`` makes it stop listening and exit
once its agents are gone. Without any agent for ``SECONDS`` it exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from types import ModuleType
from typing import Any

_HEADER = struct.Struct(">I")
_MAX_FDS = 4
_PR_SET_PDEATHSIG = 1
#: Status of a child that could not be set up (the agent gets the errno as a start failure).
_EXIT_SETUP = 127


# -- framing ---------------------------------------------------------------------------------------


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one frame, with ``fds`` attached to its header."""
    body = json.dumps(message, separators=(",", ":")).encode()
    data = _HEADER.pack(len(body)) + body
    sent = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """Receive one frame and the descriptors sent with it; ``None`` at end of file."""
    try:
        head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
        if not head:
            return None
        if len(head) < _HEADER.size:
            head += _recv_exact(sock, _HEADER.size - len(head))
        (size,) = _HEADER.unpack(head)
        message: dict[str, Any] = json.loads(_recv_exact(sock, size))
    except (EOFError, OSError, ValueError):  # reset, timed out, or not a frame: the agent is gone
        return None
    return message, list(fds)


# -- safety checks after the imports ---------------------------------------------------------------


def _sockets(keep: int) -> list[str]:
    found = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    for name in names:
        if int(name) == keep:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.append(f"fd {name}")
    return found


def unsafe_state(modules: list[str], control_fd: int) -> str | None:
    """Why forking workers from this process is unsafe after the imports, or ``None``."""
    if threading.active_count() > 1:
        names = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return (
            f"importing {', '.join(modules)} started {len(names)} thread(s) ({', '.join(names)}); a forked "
            "worker would get their locks but not the threads. Remove the module that starts them from "
            "agent.preload (import it in the script instead)"
        )
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return (
            f"importing {', '.join(modules)} initialised CUDA; a forked worker cannot use a CUDA context "
            "created before the fork. Remove the module that touches the GPU at import from agent.preload"
        )
    sockets = _sockets(control_fd)
    if sockets:
        return (
            f"importing {', '.join(modules)} opened socket(s) ({', '.join(sockets)}); every worker would "
            "share them. Remove the module that connects at import from agent.preload"
        )
    return None


def preload(modules: list[str], control_fd: int) -> str | None:
    """Import ``modules``; return why this process may not fork workers, or ``None``."""
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - any failure is reported to the agent
            return f"cannot preload {name!r}: {type(exc).__name__}: {exc}"
    return unsafe_state(modules, control_fd)


# -- the worker side of the fork -------------------------------------------------------------------


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


_prctl = _load_prctl()
_worker_main: ModuleType | None = None


def worker_main() -> ModuleType:
    """:mod:`rallypoint.agent.worker_main`, which runs a forked worker's script and ends the worker.

    Loaded from its file under a name of its own (this process imports nothing of rallypoint's
    packages), and registered in :data:`sys.modules` so that :func:`module_files` watches its file:
    a kept warm process whose worker code changed on disk is stale like any other.
    """
    global _worker_main
    if _worker_main is None:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "worker_main.py")
        spec = importlib.util.spec_from_file_location("_rallypoint_worker_main", path)
        if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a loader
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _worker_main = module
    return _worker_main


def _setup_child(request: dict[str, Any], out_fd: int, err_fd: int, closing: list[int], parent: int) -> None:
    """Make this forked process look like a fresh worker (session, death signal, stdio, cwd, environ)."""
    os.setsid()
    if request.get("pdeathsig") and _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the warm process died before prctl: no signal will come
            os.kill(os.getpid(), signal.SIGKILL)
    for fd in closing:
        with contextlib.suppress(OSError):
            os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in {null, out_fd, err_fd} - {0, 1, 2}:
        os.close(fd)
    if request.get("cwd"):
        os.chdir(request["cwd"])
    os.environ.clear()  # unsetenv/putenv too: C code sees the worker's environment
    os.environ.update(request["env"])


def _reseed() -> None:
    """Per-process random state a fresh interpreter would have drawn anew (``random`` reseeds itself)."""
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        with contextlib.suppress(Exception):  # a numpy without the legacy global state
            np_random.seed()


# -- the server loop -------------------------------------------------------------------------------


def module_files() -> dict[str, tuple[int, int]]:
    """The file of every module loaded now, with its modification time and size."""
    files: dict[str, tuple[int, int]] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in files:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                files[path] = (st.st_mtime_ns, st.st_size)
    return files


def changed_file(files: dict[str, tuple[int, int]]) -> str | None:
    """The first of ``files`` that changed or disappeared since it was loaded, or ``None``."""
    for path, seen in files.items():
        try:
            st = os.stat(path)
        except OSError:
            return path
        if (st.st_mtime_ns, st.st_size) != seen:
            return path
    return None


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class _Conn:
    """One agent's connection and the workers forked for it."""

    def __init__(self, sock: socket.socket, agent: bool) -> None:
        self.sock = sock
        self.agent = agent  # an agent's (hello or spawn), not a query's (info, stop): its end restarts the idle clock
        self.live: set[int] = set()  # forked, exit not reported yet
        self.zombies: set[int] = set()  # exit reported, not reaped yet


class Server:
    """Forks workers and reports their exits; single-threaded, one or more agents at a time.

    With ``keep`` seconds and a ``listen`` path (:meth:`listen`), the server outlives its first
    agent: it accepts agents of the same user on that socket, and exits after ``keep`` seconds
    without any, when told to stop, or (as soon as no agent is left) when a loaded module's file
    changed. Without, it ends with its only agent.
    """

    def __init__(self, sock: socket.socket, keep: float = 0.0, modules: list[str] | None = None) -> None:
        self.selector = selectors.DefaultSelector()
        self.conns: dict[socket.socket, _Conn] = {}
        self.pidfds: dict[int, tuple[int, _Conn]] = {}  # pid -> (pidfd, its agent), until the exit is reported
        self.keep = keep
        self.modules = list(modules or ())
        self.listener: socket.socket | None = None
        self.path: str | None = None
        self.path_ino = 0
        self.files = module_files() if keep > 0 else {}
        self.started = time.time()
        self.idle_since = time.monotonic()
        self._add(sock, agent=True)

    def _add(self, sock: socket.socket, agent: bool = False) -> None:
        conn = _Conn(sock, agent)
        self.conns[sock] = conn
        self.selector.register(sock, selectors.EVENT_READ, conn)

    def listen(self, path: str) -> None:
        """Accept agents at ``path`` (bound under a temporary name, then renamed over ``path``)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        temporary = f"{path}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        listener.bind(temporary)
        os.chmod(temporary, 0o600)
        listener.listen(64)
        os.rename(temporary, path)
        listener.setblocking(False)
        self.listener, self.path, self.path_ino = listener, path, os.stat(path).st_ino
        self.selector.register(listener, selectors.EVENT_READ, "listen")

    def retire(self) -> None:
        """Accept no more agents (the ones connected keep their workers); exit once they are gone."""
        if self.listener is None:
            return
        self.selector.unregister(self.listener)
        self.listener.close()
        self.listener = None
        with contextlib.suppress(OSError):
            if self.path is not None and os.stat(self.path).st_ino == self.path_ino:
                os.unlink(self.path)

    def serve(self) -> None:
        """Run until no agent is connected and none may come (see the class)."""
        while self.conns or self.listener is not None:
            timeout = None
            if not self.conns:
                timeout = self.idle_since + self.keep - time.monotonic()
                if timeout <= 0:
                    break
            for key, _events in self.selector.select(timeout):
                if key.data == "listen":
                    self.accept()
                elif isinstance(key.data, _Conn):
                    if key.data.sock in self.conns:
                        received = recv(key.data.sock)
                        self.drop(key.data) if received is None else self.handle(key.data, *received)
                else:
                    self.reap_exit(key.data)
        self.retire()

    def accept(self) -> None:
        """A new agent: only one of this server's own user is let in."""
        assert self.listener is not None
        try:
            sock, _addr = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if peer_uid(sock) != os.getuid():
            sock.close()
            return
        sock.setblocking(True)
        sock.settimeout(30.0)  # an agent that stops reading mid-frame is dropped, not waited for
        self._add(sock)

    def drop(self, conn: _Conn) -> None:
        """The agent closed its connection (or died): kill the workers it left, reap what can be."""
        self.selector.unregister(conn.sock)
        del self.conns[conn.sock]
        conn.sock.close()
        for pid in conn.live:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        for pid in conn.zombies:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        conn.live.clear()
        conn.zombies.clear()
        if conn.agent and not self.conns:
            self.idle_since = time.monotonic()

    def tell(self, conn: _Conn, message: dict[str, Any]) -> None:
        """Send to one agent; one that cannot be written to any more is dropped."""
        if conn.sock not in self.conns:
            return
        try:
            send(conn.sock, message)
        except OSError:
            self.drop(conn)

    def stale(self) -> str | None:
        """Why this kept server may not fork any more (a loaded module's file changed), or ``None``."""
        path = changed_file(self.files) if self.keep > 0 else None
        if path is None:
            return None
        self.retire()
        return f"{path} changed since the warm process (pid {os.getpid()}) loaded it"

    def handle(self, conn: _Conn, message: dict[str, Any], fds: list[int]) -> None:
        """Act on one request from an agent."""
        op = message.get("op")
        conn.agent = conn.agent or op in ("hello", "spawn")
        if op == "spawn" and len(fds) == 2:
            why = self.stale()
            if why is None:
                self.spawn(conn, message, fds[0], fds[1])
                return
            self.tell(conn, {"op": "failed", "id": message.get("id"), "errno": 0, "message": why, "stale": True})
        for fd in fds:
            os.close(fd)
        if op == "reap":
            pid = int(message["pid"])
            if pid in conn.zombies:
                conn.zombies.discard(pid)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        elif op == "hello":
            why = self.stale()
            self.tell(conn, {"op": "stale", "message": why} if why else {"op": "ready", "seconds": 0.0, **self.info()})
        elif op == "info":
            self.tell(conn, {"op": "info", **self.info()})
        elif op == "stop":
            self.retire()
            self.tell(conn, {"op": "stopping", **self.info()})

    def info(self) -> dict[str, Any]:
        """What ``rallypoint warm list`` shows of this server."""
        return {
            "pid": os.getpid(),
            "python": sys.executable,
            "modules": self.modules,
            "keep": self.keep,
            "started": self.started,
            "agents": sum(1 for conn in self.conns.values() if conn.agent),  # not who asks
            "workers": len(self.pidfds),
            "accepting": self.listener is not None,
        }

    def spawn(self, conn: _Conn, request: dict[str, Any], out_fd: int, err_fd: int) -> None:
        """Fork one worker; answer ``spawned`` or ``failed``."""
        read_end, write_end = os.pipe()
        closing = [s.fileno() for s in self.conns] + [
            self.selector.fileno() if hasattr(self.selector, "fileno") else -1
        ]
        closing += [fd for fd, _conn in self.pidfds.values()] + [read_end]
        closing += [self.listener.fileno()] if self.listener is not None else []
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                kind, target, args = worker_main().parse_argv(request["argv"])
                _setup_child(request, out_fd, err_fd, [fd for fd in closing if fd >= 0], parent)
            except OSError as exc:
                os.write(write_end, json.dumps([exc.errno, exc.strerror or str(exc)]).encode())
                os._exit(_EXIT_SETUP)
            except BaseException as exc:  # noqa: BLE001
                os.write(write_end, json.dumps([0, f"{type(exc).__name__}: {exc}"]).encode())
                os._exit(_EXIT_SETUP)
            os.close(write_end)  # set up: the server stops waiting
            _reseed()
            worker_main().run_main(kind, target, args)
        os.close(write_end)
        os.close(out_fd)
        os.close(err_fd)
        failure = b""
        while chunk := os.read(read_end, 65536):
            failure += chunk
        os.close(read_end)
        if failure:
            os.waitpid(pid, 0)
            errno, text = json.loads(failure)
            self.tell(conn, {"op": "failed", "id": request["id"], "errno": errno, "message": text})
            return
        pidfd = os.pidfd_open(pid)
        self.pidfds[pid] = (pidfd, conn)
        conn.live.add(pid)
        self.selector.register(pidfd, selectors.EVENT_READ, pid)
        self.tell(conn, {"op": "spawned", "id": request["id"], "pid": pid})

    def reap_exit(self, pid: int) -> None:
        """A worker's pidfd became readable: report its exit, keep it a zombie for its agent to reap."""
        pidfd, conn = self.pidfds.pop(pid)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        conn.live.discard(pid)
        if conn.sock not in self.conns:  # its agent is gone: nobody will reap it
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            return
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        if info is None:  # pragma: no cover - the pidfd said it exited
            return
        returncode = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        conn.zombies.add(pid)
        self.tell(conn, {"op": "exit", "pid": pid, "returncode": returncode})


def _options(args: list[str]) -> tuple[float, str | None, list[str]]:
    """``[--keep SECONDS] [--listen PATH] MODULE...`` as (keep, listen, modules)."""
    keep, listen = 0.0, None
    while len(args) >= 2 and args[0] in ("--keep", "--listen"):
        if args[0] == "--keep":
            keep = float(args[1])
        else:
            listen = args[1]
        args = args[2:]
    return keep, listen, args


def main(argv: list[str]) -> int:
    """``_server.py FD [--keep S --listen PATH] MODULE...``: preload, listen, say ready (or why not), serve."""
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]  # a worker's sys.path[0] is its script's directory, set at fork
    control_fd = int(argv[1])
    keep, listen, modules = _options(list(argv[2:]))
    worker_main()  # before the first look at the module files
    sock = socket.socket(fileno=control_fd)
    started = time.monotonic()
    problem = preload(modules, control_fd)
    if problem is not None:
        send(sock, {"op": "refused", "message": problem})
        return 2
    server = Server(sock, keep, modules)
    if listen is not None and keep > 0:
        server.listen(listen)
    server.tell(server.conns[sock], {"op": "ready", **server.info(), "seconds": time.monotonic() - started})
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
