"""Several RPC agents in one process over an in-memory transport (no gRPC in this test process).

Frames are joined into bytes and run by the callee's handler on its own thread pool, as a real
transport would; :meth:`LocalTransport.kill` makes a worker unreachable (its calls fail as a dead
peer's do).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rallypoint.rpc.agent import RpcAgent, WorkerInfo
from rallypoint.rpc.exposure import Exposure
from rallypoint.rpc.transport import TransportUnavailable

_SERVERS: dict[str, LocalTransport] = {}
_PORTS = itertools.count()


class LocalTransport:
    """An in-memory transport: ``local:N`` addresses, one thread pool per worker.

    ``deferred``: the handler may answer with a future of the reply (an async_execution call),
    which is sent when it completes, with the pool's thread free meanwhile.
    """

    def __init__(self, threads: int = 8, *, deferred: bool = True) -> None:
        self.deferred_replies = deferred
        self.address = f"local:{next(_PORTS)}"
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix=self.address)
        self.handler: Any = None
        self.dead = False

    def serve(self, handler: Any, host: str) -> str:
        self.handler = handler
        _SERVERS[self.address] = self
        return self.address

    def _target(self, address: str) -> LocalTransport:
        target = _SERVERS.get(address)
        if target is None or target.dead or self.dead:
            raise TransportUnavailable(f"{address} is not reachable")
        return target

    def call(self, address: str, frame: list[Any], timeout: float | None, reply: Any) -> None:
        try:
            target = self._target(address)
            data = b"".join(bytes(p) for p in frame)
            fut = target.pool.submit(target.handler, data)
        except (TransportUnavailable, RuntimeError) as exc:
            reply(None, exc if isinstance(exc, TransportUnavailable) else TransportUnavailable(str(exc)))
            return

        def send(parts: list[Any]) -> None:
            if self._reply_dead(address):
                reply(None, TransportUnavailable(f"{address} died during the call"))
            else:
                reply(bytearray(b"".join(bytes(p) for p in parts)), None)

        def done(f: Any) -> None:
            answer = f.result()
            if isinstance(answer, list):
                send(answer)
            else:  # a deferred reply
                answer.add_done_callback(lambda later: send(later.wait()))

        fut.add_done_callback(done)

    def _reply_dead(self, address: str) -> bool:
        target = _SERVERS.get(address)
        return target is None or target.dead

    def kill(self) -> None:
        """The worker dies: every call to or from it fails from now on."""
        self.dead = True

    def close(self) -> None:
        _SERVERS.pop(self.address, None)
        self.pool.shutdown(wait=False)


@contextlib.contextmanager
def local_group(
    count: int = 3,
    *,
    allow: tuple[str, ...] = (),
    threads: int = 8,
    deferred: bool = True,
    timeout: float = 30,
    exposure: Callable[[], Exposure] | None = None,
    allow_pickle: bool = False,
) -> Iterator[list[RpcAgent]]:
    """``count`` agents named ``w0``... over :class:`LocalTransport` (``threads`` each).

    ``exposure`` makes each agent's rules (default: ``Exposure(allow)``); ``allow_pickle``: the
    pickle serializer on every agent.
    """
    agents = []
    for rank in range(count):
        transport = LocalTransport(threads, deferred=deferred)
        rules = exposure() if exposure is not None else Exposure(allow)
        agent = RpcAgent(
            WorkerInfo(f"w{rank}", rank), transport, exposure=rules, allow_pickle=allow_pickle, timeout=timeout
        )
        agent.serve("local")
        agents.append(agent)
    for agent in agents:
        agent.set_peers([a.info for a in agents])
    try:
        yield agents
    finally:
        for agent in agents:
            agent.close()


@pytest.fixture
def group() -> Iterator[list[RpcAgent]]:
    """Three agents ``w0``, ``w1``, ``w2`` over the in-memory transport."""
    with local_group(3) as agents:
        yield agents


@pytest.fixture
def make_group() -> Any:
    """:func:`local_group` itself, for tests that need other sizes, thread counts or transports."""
    return local_group
