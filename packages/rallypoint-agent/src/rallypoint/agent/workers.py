"""Worker processes: start, watch, signal and stop one attempt's workers.

Design:

* **Process groups.** Every worker is started with ``subprocess.Popen(start_new_session=True)``:
  it leads its own session and process group (pgid == pid), so a signal sent with
  :func:`os.killpg` also reaches the processes the worker started itself (data loader workers,
  compilers), and a Ctrl-C on the agent's terminal is not delivered to workers twice.
* **No orphans (Linux).** A worker asks the kernel for ``SIGKILL`` when its parent dies
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so an agent killed with ``SIGKILL`` takes its workers
  with it (:mod:`rallypoint.agent.death_signal`). The call runs in ``preexec_fn``, between
  ``fork`` and ``exec``: this costs no extra
  interpreter start (a re-exec shim would start Python twice per worker). ``preexec_fn`` is unsafe
  when the child needs a lock another thread held at fork time; the function used here takes
  none: it calls a ``prctl`` resolved with :mod:`ctypes` *before* the fork, plus
  :func:`os.getppid` and :func:`os.kill`, so it neither imports, nor logs, nor touches Python
  locks. The trade-off: ``preexec_fn`` makes :mod:`subprocess` use ``fork`` rather than
  ``vfork``/``posix_spawn``, slower when the agent process is very large (it is not meant to be).
  If the agent died between ``fork`` and ``prctl``, the child sees a different parent pid right
  after the call and kills itself, closing that race.
  The kernel sends the death signal when the *thread* that forked exits, not the process; all
  workers are therefore forked by one long-lived spawner thread (:mod:`rallypoint.agent.spawner`),
  so starting workers from a short-lived thread (an executor, a test) does not kill them when it
  ends. A signal that reaches the agent while a worker is being started is raised only once that
  worker is recorded, so it is stopped with the others.
  The death signal reaches the worker only. What the worker started is its **session** (see
  below); a ``SIGKILL``-ed agent runs no code, so a tiny sentinel process
  (:mod:`rallypoint.agent.sentinel`) watches the agent and kills every registered worker session
  when the agent is gone, however it ended.
  Elsewhere than Linux there is no death signal: workers of a ``SIGKILL``-ed agent are killed by
  the sentinel's process-group kill only.
* **The whole tree.** A worker's session holds everything it started, also processes that moved
  to a process group of their own (a shell with job control). :meth:`WorkerGroup.stop` (every
  restart, a stop on SIGTERM, the end of a job) ends with ``SIGKILL`` to each worker's process
  group and then to every other member of its session (found in ``/proc``), and the sentinel does
  the same when the agent dies. A process that starts a session of its own (``setsid``, a daemon)
  has left the job and is not followed.
* **Exit detection without polling.** One daemon thread per worker blocks in ``waitid`` and,
  the moment the kernel reports the exit, records a :class:`WorkerExit` (exit code or signal
  name, start and exit time) and wakes :meth:`WorkerGroup.wait_any` / :meth:`WorkerGroup.wait`
  and the ``on_exit`` callback: a few milliseconds after the kill (measured median ~4.5 ms for a
  SIGKILLed Python worker, mostly the kernel tearing the process down).
  The watcher uses ``waitid(WEXITED | WNOWAIT)`` and leaves the worker a zombie until
  :meth:`WorkerGroup.stop` reaps it, so the worker's pid and process-group id cannot be reused
  while the agent may still signal that group.
* Workers get ``stdin`` from ``/dev/null``: several workers cannot share the agent's terminal.
* **Warm workers.** With a :class:`rallypoint.agent.warm.WarmLauncher` (``[agent] preload``),
  workers are forked by the warm process instead of started with ``Popen``; each comes back as a
  :class:`rallypoint.agent.warm.WarmProcess` with the same interface, so everything above
  (process groups, sessions, the sentinel, zombies kept until :meth:`WorkerGroup.stop`) holds
  unchanged. Their pipes are made here and handed to the warm process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rallypoint.agent import console, sentinel
from rallypoint.agent.death_signal import PDEATHSIG_SUPPORTED, make_preexec
from rallypoint.agent.logs import WorkerLogs
from rallypoint.agent.spawner import in_thread, interruptions_held, spawner, wait_through
from rallypoint.agent.warm import WarmLauncher, WarmProcess
from rallypoint.agent.worker_errors import WorkerStartError
from rallypoint.core.errors import RallypointError

__all__ = [
    "KILL_WAIT",
    "PDEATHSIG_SUPPORTED",
    "UnkillableWorkers",
    "WorkerExit",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerStartError",
    "signal_name",
]

#: Seconds a worker's start in progress is still waited for after a signal (a fork takes
#: milliseconds; a warm worker forked later still dies with the agent's warm connection).
FORK_PATIENCE = 10.0


def signal_name(returncode: int) -> str | None:
    """Return ``"SIGKILL"`` etc. for a negative ``Popen`` return code, else ``None``."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"SIG{-returncode}"


def _wait_no_reap(popen: subprocess.Popen[bytes] | WarmProcess) -> int:
    """Block until ``popen`` exits and return its return code, leaving it a zombie.

    An unreaped worker keeps its pid, hence its process-group id, from being reused, so
    :meth:`WorkerGroup.stop` can signal the group (the worker's leftover children) without any
    risk of hitting an unrelated process. :meth:`WorkerGroup.stop` reaps it.
    """
    if hasattr(os, "waitid"):
        try:
            info = os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # already reaped elsewhere: Popen knows the status
            pass
        else:
            if info is not None:
                if info.si_code == os.CLD_EXITED:
                    return info.si_status
                return -info.si_status  # CLD_KILLED / CLD_DUMPED
    return popen.wait()


#: Seconds :meth:`WorkerGroup.stop` waits for the workers after SIGKILL before it gives up on them.
KILL_WAIT = 10.0


class UnkillableWorkers(RallypointError):
    """Workers that SIGKILL did not end (stuck in the kernel, state ``D``): the host needs attention.

    Attributes:
        pids: ``rank -> pid`` of those workers.
    """

    def __init__(self, pids: dict[int, int]) -> None:
        from rallypoint.agent.debug_collect import proc_state

        self.pids = dict(pids)
        described = []
        for rank, pid in sorted(self.pids.items()):
            tasks = proc_state(pid).get("tasks") or []
            main = next((t for t in tasks if t["tid"] == pid), {"state": "?", "wchan": ""})
            described.append(f"rank {rank} pid {pid} (state {main['state']}, wchan {main['wchan'] or '?'})")
        super().__init__(
            f"worker(s) {', '.join(described)} did not exit {KILL_WAIT:g} s after SIGKILL: stuck in the kernel; "
            "this host needs attention (ps -o pid,stat,wchan -p PID; dmesg). The agent stopped waiting for them."
        )


@dataclass(frozen=True)
class WorkerSpec:
    """How to start one worker.

    Attributes:
        rank: the worker's global rank; the key for results, logs and signals.
        argv: the command line, ``argv[0]`` being the program (looked up in ``PATH``).
        env: the worker's *complete* environment; ``None`` inherits the agent's. Build it as
            ``{**os.environ, **worker_vars}`` to add variables.
        cwd: working directory; the agent's by default.
    """

    rank: int
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    cwd: str | os.PathLike[str] | None = None


@dataclass(frozen=True)
class WorkerExit:
    """How and when a worker ended.

    Attributes:
        rank: global rank.
        pid: process id it had.
        returncode: ``Popen`` return code: the exit status, or ``-N`` when killed by signal N.
        started_at: start time, seconds since the epoch.
        exited_at: time its exit was observed, seconds since the epoch (comparable across hosts
            with synchronised clocks; used to find the first failure).
    """

    rank: int
    pid: int
    returncode: int
    started_at: float
    exited_at: float

    @property
    def ok(self) -> bool:
        """Whether the worker exited with status 0."""
        return self.returncode == 0

    @property
    def exit_code(self) -> int | None:
        """The exit status, or ``None`` when the worker was killed by a signal."""
        return self.returncode if self.returncode >= 0 else None

    @property
    def signal_name(self) -> str | None:
        """``"SIGKILL"`` etc. when the worker was killed by a signal, else ``None``."""
        return signal_name(self.returncode)

    def describe(self) -> str:
        """Return ``"exit code 3"`` or ``"signal SIGKILL"``."""
        name = self.signal_name
        return f"signal {name}" if name else f"exit code {self.returncode}"


class _Sentinel:
    """The agent's end: starts the sentinel process on first use and tells it about sessions.

    One per agent process (:data:`_sentinel`). Thread-safe; never raises: without a sentinel
    (it could not start, or was killed), workers still die with the agent by their parent-death
    signal, only what they started may outlive a ``SIGKILL``-ed agent.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = -1
        #: The sentinel's process id, once started.
        self.process_id: int | None = None

    def _ensure(self) -> int | None:
        if self._pid == os.getpid():  # started (or failed to) by this process: once is enough
            return self._fd
        self._pid = os.getpid()
        self._fd = None
        read_fd, write_fd = os.pipe()  # both close-on-exec: no worker inherits the write end
        # posix_spawn, not Popen: the sentinel is meant to outlive this process, so no Popen
        # object may warn about it still running at exit
        actions = [
            (os.POSIX_SPAWN_DUP2, read_fd, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
        ]
        argv = [sys.executable, "-I", "-S", os.path.abspath(sentinel.__file__)]
        try:
            if not sys.executable:
                raise OSError("sys.executable is unknown")
            self.process_id = os.posix_spawn(argv[0], argv, os.environ, file_actions=actions, setsid=True)
        except (OSError, NotImplementedError) as err:  # NotImplementedError: no setsid for posix_spawn here
            os.close(write_fd)
            console.message(f"rallypoint: cannot start the worker sentinel ({err}); processes started by workers "
                            "may outlive an agent killed with SIGKILL\n")  # fmt: skip
            return None
        finally:
            os.close(read_fd)
        self._fd = write_fd
        return write_fd

    def _send(self, line: str) -> None:
        with self._lock:
            fd = self._ensure()
            if fd is not None:
                with contextlib.suppress(OSError):  # sentinel gone: EPIPE
                    os.write(fd, line.encode())

    def register(self, sid: int) -> None:
        """Have session ``sid`` killed if this process ends before :meth:`unregister`."""
        self._send(f"+{sid}\n")

    def unregister(self, sid: int) -> None:
        """Forget session ``sid`` (call after killing it, before reaping its leader)."""
        self._send(f"-{sid}\n")


_sentinel = _Sentinel()


@dataclass
class _Worker:
    spec: WorkerSpec
    popen: subprocess.Popen[bytes] | WarmProcess
    started_at: float


class WorkerGroup:
    """The worker processes of one attempt on this host.

    Args:
        logs: where output goes. With logs, each worker's stdout and stderr are pipes read by
            ``logs``; without, workers inherit the agent's stdout and stderr.
        pdeathsig: the workers and everything they start die with the agent: a ``SIGKILL``
            parent-death signal for the workers (Linux) and the sentinel for their sessions.
        on_exit: called from a watcher thread with each :class:`WorkerExit` as it happens, e.g.
            to push it into the agent's event queue. Keep it short and never let it block.
        warm: fork the workers from this warm process (``[agent] preload``) instead of starting
            fresh interpreters; their command lines must be ``[python, -u, script|-m module, ...]``.

    Use as a context manager to :meth:`stop` the workers on the way out.
    """

    def __init__(
        self,
        *,
        logs: WorkerLogs | None = None,
        pdeathsig: bool = True,
        on_exit: Callable[[WorkerExit], None] | None = None,
        warm: WarmLauncher | None = None,
    ) -> None:
        self.logs = logs
        self.warm = warm if warm is not None and warm.modules else None  # one without modules is inert
        self.pdeathsig = pdeathsig and PDEATHSIG_SUPPORTED
        self._sentinel = _sentinel if pdeathsig else None
        self._on_exit = on_exit
        self._workers: dict[int, _Worker] = {}
        self._exits: dict[int, WorkerExit] = {}
        self._unseen: queue.SimpleQueue[WorkerExit] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._started = False

    # -- starting --------------------------------------------------------------------------------

    def start(self, specs: Iterable[WorkerSpec], *, head_start: float = 0.0) -> None:
        """Start every worker; all or nothing.

        Args:
            specs: the workers, started in this order.
            head_start: seconds between starting the first worker and the others (see
                :attr:`rallypoint.agent.settings.AgentSettings.store_head_start`).

        Raises:
            WorkerStartError: a worker could not be started; those already started are killed.
            RallypointError: a worker's log file could not be created (likewise all-or-nothing).
            ValueError: duplicate ranks, or the group was already started.
        """
        spec_list = list(specs)
        ranks = [s.rank for s in spec_list]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"duplicate worker ranks in {sorted(ranks)}")
        with self._cond:
            if self._started:
                raise ValueError("this WorkerGroup was already started; use a new one for the next attempt")
            self._started = True
        for index, spec in enumerate(spec_list):
            if index == 1 and head_start > 0:
                time.sleep(head_start)
            try:  # a signal that comes meanwhile is raised once the started worker is recorded
                if self.warm is not None:
                    # its imports are waited for here, where a signal interrupts the wait; then
                    # the fork, in a thread of its own (the warm connection may need the spawner's)
                    self.warm.wait_ready()
                    started = in_thread(functools.partial(self._spawn_warm, self.warm, spec))
                else:
                    started = spawner.submit(functools.partial(self._spawn, spec))
                worker, interruption = wait_through(started, patience=FORK_PATIENCE)
            except (OSError, subprocess.SubprocessError) as err:
                self.stop(grace=0)
                raise WorkerStartError(spec.rank, spec.argv, err, spec.env) from err
            except RallypointError:  # the warm process refused or died: all or nothing still
                self.stop(grace=0)
                raise
            with interruptions_held():  # a signal now waits until the worker is recorded, watched and read
                with self._cond:
                    self._workers[spec.rank] = worker
                threading.Thread(
                    target=self._watch, args=(worker,), name=f"rallypoint-worker-{spec.rank}", daemon=True
                ).start()
                if self.logs is not None:
                    try:
                        self.logs.attach(spec.rank, worker.popen.stdout, worker.popen.stderr)
                    except Exception:
                        self.stop(grace=0)
                        raise
            if interruption is not None:
                raise interruption

    def _spawn(self, spec: WorkerSpec) -> _Worker:
        pipe = subprocess.PIPE if self.logs is not None else None
        preexec = make_preexec(os.getpid()) if self.pdeathsig else None
        started_at = time.time()
        popen = subprocess.Popen(
            list(spec.argv),
            env=dict(spec.env) if spec.env is not None else None,
            cwd=Path(spec.cwd) if spec.cwd is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=pipe,
            stderr=pipe,
            start_new_session=True,
            preexec_fn=preexec,  # unsafe-with-threads caveat: see the module docstring
        )
        if self._sentinel is not None:
            self._sentinel.register(popen.pid)  # pid == sid: it leads its own session
        return _Worker(spec, popen, started_at)

    def _spawn_warm(self, warm: WarmLauncher, spec: WorkerSpec) -> _Worker:
        """Fork the worker from the warm process, with pipes made here as ``Popen`` would make them."""
        pipes = (os.pipe(), os.pipe()) if self.logs is not None else None
        started_at = time.time()
        try:
            handle = warm.spawn(
                spec.argv,
                env=spec.env,
                cwd=spec.cwd,
                stdout=pipes[0][1] if pipes else 1,
                stderr=pipes[1][1] if pipes else 2,
                pdeathsig=self.pdeathsig,
            )
        except BaseException:
            for fd in [fd for pair in pipes or () for fd in pair]:
                os.close(fd)
            raise
        if pipes is not None:
            os.close(pipes[0][1])
            os.close(pipes[1][1])
            handle.stdout = open(pipes[0][0], "rb")  # noqa: SIM115 - the logs own it (as Popen's pipes)
            handle.stderr = open(pipes[1][0], "rb")  # noqa: SIM115
        if self._sentinel is not None:
            self._sentinel.register(handle.pid)
        return _Worker(spec, handle, started_at)

    def _watch(self, worker: _Worker) -> None:
        returncode = _wait_no_reap(worker.popen)
        exit_info = WorkerExit(
            rank=worker.spec.rank,
            pid=worker.popen.pid,
            returncode=returncode,
            started_at=worker.started_at,
            exited_at=time.time(),
        )
        with self._cond:
            self._exits[exit_info.rank] = exit_info
            self._unseen.put(exit_info)
            self._cond.notify_all()
        if self._on_exit is not None:
            try:
                self._on_exit(exit_info)
            except Exception as err:  # noqa: BLE001 - a watcher thread has no one to raise to
                console.message(f"rallypoint: on_exit callback failed for rank {exit_info.rank}: {err!r}\n")

    # -- state -----------------------------------------------------------------------------------

    @property
    def pids(self) -> dict[int, int]:
        """Process id of every started worker, by rank."""
        with self._cond:
            return {rank: w.popen.pid for rank, w in self._workers.items()}

    @property
    def exits(self) -> dict[int, WorkerExit]:
        """Exits observed so far, by rank."""
        with self._cond:
            return dict(self._exits)

    def running(self) -> list[int]:
        """Ranks whose process has not exited yet, sorted."""
        with self._cond:
            return sorted(r for r in self._workers if r not in self._exits)

    # -- waiting ---------------------------------------------------------------------------------

    def wait_any(self, timeout: float | None = None) -> WorkerExit | None:
        """Return the next exit not returned before, waiting up to ``timeout`` seconds.

        Returns ``None`` on timeout, or at once when every worker's exit was already returned.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self._unseen.get_nowait()
            except queue.Empty:
                pass
            with self._cond:
                if len(self._exits) == len(self._workers) and self._unseen.empty():
                    return None
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            try:
                return self._unseen.get(timeout=remaining)
            except queue.Empty:
                return None

    def wait(self, timeout: float | None = None) -> dict[int, WorkerExit] | None:
        """Wait until every worker exited; return all exits, or ``None`` on timeout."""
        with self._cond:
            done = self._cond.wait_for(lambda: len(self._exits) == len(self._workers), timeout)
            return dict(self._exits) if done else None

    # -- signals ---------------------------------------------------------------------------------

    def _signal_groups(self, sig: int, ranks: Iterable[int]) -> None:
        with self._cond:
            targets = [self._workers[r].popen.pid for r in ranks if r in self._workers]
        for pgid in targets:
            # The group outlives its leader while the worker's own children live: signal it even
            # after the worker exited. ESRCH (group gone) and EPERM (zombie-only group on some
            # systems) are both "nothing left to signal".
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)

    def forward_signal(self, sig: int) -> None:
        """Send ``sig`` to the process group of every worker still running."""
        self._signal_groups(sig, self.running())

    def stop(self, grace: float = 30.0, sig: int = signal.SIGTERM) -> dict[int, WorkerExit]:
        """Stop every worker: ``sig`` to each process group, up to ``grace`` seconds, then SIGKILL.

        Returns the exit of every worker, and reaps them. Idempotent. Workers that already
        exited are not signalled, but what they started (every process left in their sessions,
        whatever its process group) still gets the SIGKILL. Call it at the end of every attempt,
        also after success.
        """
        if grace > 0 and self.running():
            self._signal_groups(sig, self.running())
            self.wait(grace)
        with self._cond:
            popens = [w.popen for w in self._workers.values()]
        # Unreaped workers keep their pids, so their session ids name nobody else.
        sentinel.kill_sessions(p.pid for p in popens if p.returncode is None)
        exits = self.wait(KILL_WAIT)
        stuck = {} if exits is not None else {r: w.popen.pid for r, w in self._workers.items() if r in self.running()}
        for popen in popens:
            if popen.pid in stuck.values():
                continue  # SIGKILL did not end it (state D): waiting for it would hang the agent
            if popen.returncode is None and self._sentinel is not None:
                self._sentinel.unregister(popen.pid)  # killed: the sentinel may forget it
            with contextlib.suppress(ChildProcessError):
                popen.wait()  # reap: every exit is known, so this does not block
        if exits is None:
            raise UnkillableWorkers(stuck)
        return exits

    def __del__(self) -> None:
        # Reap workers whose exit was seen but that stop() never reaped (instant: they are
        # zombies). A worker still running is left to subprocess's own warning and cleanup.
        for rank in list(getattr(self, "_exits", {})):
            worker = self._workers.get(rank)
            if worker is not None and worker.popen.returncode is None:
                sentinel.kill_sessions([worker.popen.pid])  # then its pid may be reused
                if self._sentinel is not None:
                    self._sentinel.unregister(worker.popen.pid)
                with contextlib.suppress(ChildProcessError, OSError, subprocess.TimeoutExpired):
                    worker.popen.wait(timeout=0)

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace=5.0)
