"""Fixtures of the grpc plugin's tests: real servers in their own processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RALLYPOINT = str(Path(sys.executable).with_name("rallypoint"))


class ServerProcess:
    """``rallypoint rdzv serve`` in a child process; ``address`` is what it printed."""

    def __init__(self, *args: str, port: int = 0) -> None:
        self.args = args
        # stderr goes to a file: a pipe nobody reads would fill up and block the server
        self.log = tempfile.NamedTemporaryFile(prefix="rdzv-serve-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [RALLYPOINT, "rdzv", "serve", "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "serving on" not in line:
            self.proc.kill()
            self.proc.communicate(timeout=30)
            raise AssertionError(f"rdzv serve did not start: {line!r} {self.stderr()}")
        self.address = line.split("serving on ")[1].split()[0]
        self.port = int(self.address.rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL the server and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.communicate(timeout=30)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)

    def stderr(self) -> str:
        """What the server wrote to stderr so far."""
        return Path(self.log.name).read_text(errors="replace")

    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self.proc.poll() is None


@pytest.fixture
def start_server() -> Iterator[type[ServerProcess]]:
    """A factory of servers, every one killed at the end of the test."""
    started: list[ServerProcess] = []

    class Tracked(ServerProcess):
        def __init__(self, *args: str, port: int = 0) -> None:
            super().__init__(*args, port=port)
            started.append(self)

    yield Tracked
    for server in started:
        server.kill()


@pytest.fixture
def server(start_server: type[ServerProcess]) -> ServerProcess:
    """One plain server (no token, no TLS)."""
    return start_server()


@pytest.fixture
def serve() -> Iterator[Any]:
    """A factory of in-process rendezvous servers (``RendezvousServer``), every one stopped at the end."""
    from rallypoint_grpc.rendezvous.server import RendezvousServer, ServerConfig

    servers: list[RendezvousServer] = []

    def start(**kwargs: Any) -> RendezvousServer:
        server = RendezvousServer(ServerConfig(**kwargs)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def no_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process servers started from now on lack the ``Session`` method, as servers from before it did."""
    import grpc

    real = grpc.method_handlers_generic_handler

    def generic(service: str, handlers: dict[str, Any]) -> Any:
        handlers.pop("Session", None)  # the same table is registered next, by name: drop it there too
        return real(service, handlers)

    monkeypatch.setattr(grpc, "method_handlers_generic_handler", generic)
