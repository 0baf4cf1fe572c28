"""How the workers of an RPC group meet: a key-value store (torch's ``TCPStore``).

Under ``rallypoint run`` every worker has ``MASTER_ADDR``/``MASTER_PORT``, the address of the
job's ``env://`` store that worker rank 0 serves (as torch's ``init_process_group`` does). When
the default process group is already initialized, its store is reused (under a prefix);
otherwise rank 0 starts the store there and the others connect. Through it, rank 0 publishes the
job's token, every worker publishes its name and address, and shutdown runs its barriers.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from rallypoint.rpc.agent import WorkerInfo
from rallypoint.rpc.errors import RpcError, RpcTimeout, WorkerUnavailable

__all__ = ["StoreGroup", "serving_host"]

_GENERATION = 0
#: A barrier looks at the store after this pause, then after twice as long... up to _LAST_POLL.
_FIRST_POLL, _LAST_POLL = 0.002, 0.1
#: How often a barrier asks about the ranks that have not arrived (are they still alive?).
_LOOK_EVERY = 1.0


def _store_address(init_method: str | None, environ: Mapping[str, str]) -> tuple[str, int]:
    if init_method and init_method != "env://":
        if not init_method.startswith("tcp://"):
            raise RpcError(f"init_method {init_method!r} is not supported; use tcp://HOST:PORT or env://")
        host, _, port = init_method.removeprefix("tcp://").rpartition(":")
        return host.strip("[]"), int(port)
    addr, port = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", "")
    if not addr or not port.isdigit():
        raise RpcError(
            "init_rpc needs the group's store: run under `rallypoint run` (or torchrun), set MASTER_ADDR and "
            "MASTER_PORT, or pass RpcOptions(init_method='tcp://HOST:PORT')"
        )
    return addr, int(port)


def serving_host(store_host: str, store_port: int) -> str:
    """The local address that routes to the store (the one peers can reach this worker at)."""
    try:
        infos = socket.getaddrinfo(store_host, store_port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise RpcError(f"cannot resolve the store host {store_host!r}: {exc}") from None
    family, _, _, _, sockaddr = infos[0]
    if ipaddress.ip_address(sockaddr[0]).is_loopback:
        return str(sockaddr[0])
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)
        return str(probe.getsockname()[0])


class StoreGroup:
    """The group's meeting point: token, addresses and barriers, under a per-init prefix."""

    def __init__(self, store: Any, rank: int, world_size: int, *, owns_server: bool, host: str) -> None:
        global _GENERATION
        _GENERATION += 1
        self.store, self.rank, self.world_size = store, rank, world_size
        self.owns_server, self.host = owns_server, host
        self.prefix = f"rallypoint/rpc/{_GENERATION}/"

    @classmethod
    def connect(
        cls, rank: int, world_size: int, init_method: str | None, timeout: float, environ: Mapping[str, str] | None
    ) -> StoreGroup:
        """Reach (or, on rank 0, start) the store."""
        try:
            import torch.distributed as dist
        except ImportError:
            raise RpcError("init_rpc needs torch (its TCPStore is where the workers meet): pip install torch") from None
        env = os.environ if environ is None else environ
        if init_method is None and dist.is_available() and dist.is_initialized():
            store = dist.distributed_c10d._get_default_store()
            host, port = _store_address(None, env) if env.get("MASTER_ADDR") else ("127.0.0.1", 0)
            return cls(store, rank, world_size, owns_server=False, host=serving_host(host, port))
        host, port = _store_address(init_method, env)
        try:
            store = dist.TCPStore(  # type: ignore[attr-defined]
                host,
                port,
                world_size,
                is_master=rank == 0,
                timeout=datetime.timedelta(seconds=timeout),
                wait_for_workers=False,
            )
        except (RuntimeError, OSError) as exc:
            raise RpcError(f"rank {rank} cannot reach the RPC store at {host}:{port}: {exc}") from None
        return cls(store, rank, world_size, owns_server=rank == 0, host=serving_host(host, port))

    def token(self, configured: str | None = None) -> str:
        """The job's token: rank 0 makes one (unless configured) and publishes it; the others read it."""
        key = self.prefix + "token"
        if self.rank == 0:
            token = configured or secrets.token_urlsafe(32)
            self.store.set(key, token)
            return token
        return configured or self.store.get(key).decode()

    def exchange(self, me: WorkerInfo) -> list[WorkerInfo]:
        """Publish this worker and wait for all of them; names must be unique."""
        record = {"name": me.name, "id": me.id, "address": me.address}
        self.store.set(f"{self.prefix}worker/{self.rank}", json.dumps(record))
        peers = []
        for rank in range(self.world_size):
            data = json.loads(self.store.get(f"{self.prefix}worker/{rank}"))
            peers.append(WorkerInfo(data["name"], int(data["id"]), data["address"]))
        names = [p.name for p in peers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RpcError(f"RPC worker names must be unique; {', '.join(dupes)} used by several ranks")
        return peers

    def barrier(self, name: str, timeout: float | None, dead: Callable[[int], str | None] | None = None) -> None:
        """Wait until every rank has reached ``name``.

        Args:
            name: the barrier.
            timeout: seconds (``None`` or ``0``: no limit).
            dead: ``dead(rank)``, asked every second about each rank that has not arrived yet:
                ``None`` while it lives, else its description, and the wait ends at once.

        Raises:
            RpcTimeout: ``timeout`` passed (names the ranks that did not arrive).
            WorkerUnavailable: ``dead`` found that a rank which has not arrived died.
        """
        self.store.set(f"{self.prefix}{name}/{self.rank}", "1")
        keys = [f"{self.prefix}{name}/{r}" for r in range(self.world_size)]
        counter = f"{self.prefix}{name}/arrived"
        self.store.add(counter, 1)
        deadline = None if not timeout else time.monotonic() + timeout
        # Polled (one counter read, whatever the world size), not waited for with
        # `store.wait(keys, timeout)`: the store's client logs two warnings at every timed-out
        # wait, and a worker that waits in shutdown for the others (the owner of a model, while
        # the trainer trains) filled its log with them.
        pause, next_look = _FIRST_POLL, time.monotonic() + _LOOK_EVERY
        while self.store.add(counter, 0) < self.world_size:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise RpcTimeout(f"ranks {self._missing(keys)}", f"shutdown ({name})", timeout or 0.0)
            if now >= next_look:
                for rank in self._missing(keys):
                    who = dead(rank) if dead is not None else None
                    # it may have arrived, passed and exited between the look and the ping
                    if who is not None and rank in self._missing(keys):
                        raise WorkerUnavailable(who, f"it is gone before reaching the {name} barrier of shutdown")
                next_look = time.monotonic() + _LOOK_EVERY
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - now)))
            pause = min(pause * 2, _LAST_POLL)

    def _missing(self, keys: list[str]) -> list[int]:
        """The ranks whose key is not in the store (halves the range: few requests when few are missing)."""
        out: list[int] = []
        todo = [(0, len(keys))]
        while todo:
            lo, hi = todo.pop()
            if hi <= lo or self.store.check(keys[lo:hi]):
                continue
            if hi - lo == 1:
                out.append(lo)
            else:
                mid = (lo + hi) // 2
                todo += [(mid, hi), (lo, mid)]
        return sorted(out)

    def close(self, timeout: float = 30.0) -> None:
        """Leave; the rank that serves the store waits (``timeout`` at most) for the others to leave first."""
        key = self.prefix + "left"
        if not self.owns_server:
            self.store.add(key, 1)
            return
        deadline = time.monotonic() + timeout
        while self.store.add(key, 0) < self.world_size - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
