"""The workers' torch store, served before they start (torchrun's agent store, without torch in the agent).

torch's ``env://`` store is a TCPStore at ``MASTER_ADDR:MASTER_PORT``. When worker rank 0 serves
it from its own ``init_process_group`` (``TORCHELASTIC_USE_AGENT_STORE=False``), a worker that
gets there first finds no server, and torch's client waits up to about a second before it tries
again (half a second on average, measured: ``init_process_group`` then takes 0.5 s where
torchrun's takes 15 ms). torchrun's agent serves the store itself before its workers start, and
every worker is a client (``TORCHELASTIC_USE_AGENT_STORE=True``); that needs torch in the agent.

rallypoint's agent never imports torch. When its warm process preloads torch (``[agent] preload``
names ``torch`` or one of its modules), the agent of the node that holds worker rank 0 has the
warm process fork one more process that serves the store on the round's port
(:mod:`rallypoint.agent.warm._store_host`; a fork: torch is imported already) and waits until it
says it serves; every other agent waits until that port accepts connections. Then they start
their workers, which are all clients.
Each round has its own port, so each round (a restart too) gets a new store; it ends with the
attempt. Without torch preloaded, worker rank 0 serves the store as before.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rallypoint.agent.spawner import in_thread, wait_through
from rallypoint.agent.warm import WarmLauncher, WarmProcess, _store_host

__all__ = ["LISTEN_TIMEOUT", "AgentStore", "serves_store", "wait_listening"]

#: The store's program, run by path in a fork of the warm process.
PROGRAM = str(Path(_store_host.__file__).resolve())
#: Seconds an agent waits for the store to accept connections before it starts its workers anyway.
LISTEN_TIMEOUT = 120.0
#: Seconds between two tries to connect to the store.
POLL = 0.005
#: Seconds the store's process gets to end after ``SIGTERM`` before ``SIGKILL``.
STOP_GRACE = 2.0


def serves_store(modules: Sequence[str]) -> bool:
    """Whether a warm process that preloads ``modules`` can serve the store (it imports torch).

    Example:
        >>> serves_store(["torch._dynamo"]), serves_store(["numpy", "torchvision"])
        (True, False)
    """
    return any(name == "torch" or name.startswith("torch.") for name in modules)


def wait_listening(addr: str, port: int, timeout: float, *, alive: Callable[[], bool] | None = None) -> bool:
    """Try to connect to ``addr:port`` until it accepts; ``False`` after ``timeout`` s or once ``alive()`` is false.

    A connection made is closed at once: a TCPStore takes it for a client that left.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((addr, port), timeout=min(1.0, max(POLL, left))):
                return True
        except OSError:
            pass
        if left <= 0 or (alive is not None and not alive()):
            return False
        time.sleep(POLL)


class AgentStore:
    """An agent's part in serving one attempt's store: serve it (the node of worker rank 0), or wait for it.

    Args:
        warm: the agent's warm launcher; the store is served only when it preloads torch.
        say: the agent's message function.
        timeout: seconds to wait for the store to listen (:data:`LISTEN_TIMEOUT`).
    """

    def __init__(self, warm: WarmLauncher, say: Callable[[str], None], timeout: float = LISTEN_TIMEOUT) -> None:
        self.warm = warm
        self.say = say
        self.timeout = timeout
        self._host: WarmProcess | None = None
        self._line: int | None = None  # the read end of the store's first line, while it is awaited

    @property
    def enabled(self) -> bool:
        """Whether the store is served by an agent (its warm process preloads torch)."""
        return serves_store(self.warm.modules)

    def prepare(
        self, addr: str, port: int, *, serve: bool, log: Path, round_on: Callable[[], bool] | None = None
    ) -> bool:
        """Serve the store at ``addr:port`` (with ``serve``) and wait until it accepts connections.

        ``round_on`` says whether the round still stands: a node waiting for another node's store
        stops waiting when it does not (that node is gone: the workers start, and the agent's
        watch over the round ends them).

        Returns whether the workers are to use it (``TORCHELASTIC_USE_AGENT_STORE=True``):
        ``False`` when no agent serves the store, or when this node's store process could not
        serve it (said, with its log; worker rank 0 then serves it, as without a warm process). A
        store of another node that does not listen within the timeout is said too; the workers
        start all the same (they are clients either way).

        Raises:
            WarmRefusedError: the warm process cannot fork (a preloaded module failed).
            RallypointError: the warm process died, or was not ready in time.
        """
        if not self.enabled or port <= 0:
            return False
        self.warm.wait_ready()  # interruptible here; the workers would wait for it all the same
        if not serve:
            if not wait_listening(addr, port, self.timeout, alive=round_on) and (round_on is None or round_on()):
                self.say(
                    f"the workers' store at {addr}:{port} did not accept connections within {self.timeout:g}s; "
                    "starting the workers anyway"
                )
            return True
        host = self._start(addr, port, log)
        if self._ready(host):
            return True
        code = host.wait_no_reap(1.0)  # it ended (its exit may come a moment after its output's end), or hangs
        how = "did not serve it" if code is None else f"ended (exit status {code})"
        self.say(f"the workers' store process for port {port} {how}; see {log}. Worker rank 0 serves the store instead")
        self.stop()
        return False

    def _start(self, addr: str, port: int, log: Path) -> WarmProcess:
        """Fork the store's process: its first line comes through a pipe (``self._line``), the rest goes to ``log``."""
        err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        line_r, line_w = os.pipe()
        argv = [sys.executable, "-u", PROGRAM, addr, str(port)]
        spawn = functools.partial(self.warm.spawn, argv, env=dict(os.environ), stdout=line_w, stderr=err)
        try:  # the fork in a thread of its own, as the workers' (the warm connection may need the spawner's)
            host, interruption = wait_through(in_thread(spawn), patience=5.0)
        except BaseException:
            os.close(line_r)
            raise
        finally:
            os.close(err)  # the store's process has its own copies
            os.close(line_w)
        self._host, self._line = host, line_r
        if interruption is not None:
            raise interruption
        return host

    def _ready(self, host: WarmProcess) -> bool:
        """Whether the store's process said it serves (its first line) within the timeout."""
        line = self._line
        assert line is not None
        deadline = time.monotonic() + self.timeout
        got = b""
        while b"\n" not in got and (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([line], [], [], min(left, 0.5))
            if readable:
                chunk = os.read(line, 4096)
                if not chunk:  # it ended without serving
                    break
                got += chunk
        os.close(line)
        self._line = None
        return got.startswith(b"serving ") and host.poll() is None

    def stop(self) -> None:
        """End this node's store process, if it runs (``SIGTERM``, then ``SIGKILL``), and reap it."""
        host, self._host = self._host, None
        if self._line is not None:
            os.close(self._line)
            self._line = None
        if host is not None:
            host.send_signal(signal.SIGTERM)
            try:
                host.wait(STOP_GRACE)
            except Exception:  # noqa: BLE001 - still running, or its warm process gone meanwhile
                host.kill()
                with contextlib.suppress(Exception):
                    host.wait(STOP_GRACE)
