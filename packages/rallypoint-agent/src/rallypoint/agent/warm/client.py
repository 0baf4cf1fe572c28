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

Here are the launcher and what the job's plan asks of preloading (:func:`preload_problem`,
:func:`warm_environment`); the connection to one warm process is
:mod:`rallypoint.agent.warm.connection`, a worker's handle :mod:`rallypoint.agent.warm.forked_worker`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TextIO

from rallypoint.agent import console, worker_main
from rallypoint.agent.warm.connection import READY_TIMEOUT, WarmConnection, WarmGone, WarmRefusedError
from rallypoint.agent.warm.forked_worker import WarmProcess

__all__ = ["WarmLauncher", "WarmProcess", "WarmRefusedError", "preload_problem", "warm_environment"]


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
        self._conn: WarmConnection | None = None
        self._retired: list[WarmConnection] = []  # stale kept warm processes, still running workers of ours
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

    def _ensure(self) -> WarmConnection:
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
        self._conn = WarmConnection(self.modules, self.env, self.python, self.pdeathsig, self.keep)
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
            except WarmGone:
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
