"""Helpers of the RPC tests: several RPC agents in one process over the real gRPC transport.

Each agent has its own gRPC server on 127.0.0.1; ``use_agent`` picks the one that the
module-level API (``rpc.rpc_sync``...) uses in the test's thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rallypoint import rpc
from rallypoint.rpc.agent import RpcAgent, WorkerInfo
from rallypoint.rpc.exposure import Exposure
from rallypoint_grpc.rpc.options import GrpcRpcOptions
from rallypoint_grpc.rpc.transport import GrpcRpcTransport

TOKEN = "test-token-0123456789"
#: Side effects of the functions below, to prove that a refused call ran nothing.
CALLS: list[str] = []
RELEASE = threading.Event()


@contextlib.contextmanager
def rpc_group(
    count: int = 3,
    *,
    pickle_on: tuple[int, ...] = (),
    allow: tuple[str, ...] = (),
    program: bool = False,
    **opts: Any,
) -> Iterator[list[RpcAgent]]:
    """``count`` agents named ``w0``... sharing :data:`TOKEN`; ``pickle_on``: ranks using the pickle serializer.

    ``program``: torch's compatibility mode, the program being this test directory.
    """
    agents = []
    for rank in range(count):
        pickled = rank in pickle_on
        agent = RpcAgent(
            WorkerInfo(f"w{rank}", rank),
            GrpcRpcTransport(GrpcRpcOptions(**opts), token=TOKEN, num_threads=8),
            exposure=Exposure(allow, everything=pickled, program=program, program_root=str(Path(__file__).parent)),
            allow_pickle=pickled,
            timeout=30,
        )
        agent.serve("127.0.0.1")
        agents.append(agent)
    for agent in agents:
        agent.set_peers([a.info for a in agents])
    CALLS.clear()
    RELEASE.clear()
    try:
        yield agents
    finally:
        RELEASE.set()
        for agent in agents:
            agent.close()


@rpc.expose
def add(a: Any, b: Any) -> Any:
    CALLS.append("add")
    return a + b


@rpc.expose
def fail(message: str) -> None:
    raise KeyError(message)


@rpc.expose
def fail_custom() -> None:
    raise NotImportedThereError("from a class the caller cannot rebuild")


def not_exposed_counted(x: Any) -> Any:
    """Not exposed: callable only in torch's compatibility mode."""
    CALLS.append("not_exposed_counted")
    return x


class NotImportedThereError(Exception):
    def __init__(self, text: str, extra: int = 0) -> None:
        super().__init__(text)
        self.extra = extra


@rpc.expose
def wait_release(seconds: float) -> str:
    RELEASE.wait(seconds)
    return "released"


@rpc.expose
def identity(value: Any) -> Any:
    return value


@rpc.expose
def owner_of(rref: rpc.RRef[Any]) -> str:
    return rref.owner_name()


@rpc.expose
def fetch(rref: rpc.RRef[Any]) -> Any:
    return rref.to_here()


@rpc.expose
def forward(rref: rpc.RRef[Any], to: str) -> Any:
    """Pass an RRef on to a third worker, which fetches it."""
    return rpc.rpc_sync(to, fetch, args=(rref,))


def not_exposed(path: str) -> None:
    CALLS.append("not_exposed")
    Path(path).write_text("ran")


@rpc.expose
class Counter:
    def __init__(self, start: Any) -> None:
        self.value = start

    def add(self, x: Any) -> Any:
        self.value = self.value + x
        return self.value

    def get(self) -> Any:
        return self.value

    def _secret(self) -> str:
        CALLS.append("secret")
        return "secret"


class Marker:
    """A class that is not exposed: its instances cannot travel under the safe serializer."""

    def __reduce__(self) -> Any:
        return (Path("/tmp/never").touch, ())
