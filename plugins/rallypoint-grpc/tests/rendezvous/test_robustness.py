"""The fuzzer against a real server: it never crashes or wedges; memory stays bounded; others are served."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from pathlib import Path

import pytest

from rallypoint_grpc.rendezvous.backend import GrpcBackend

from . import fuzz
from .conftest import ServerProcess


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def served(address: str) -> float:
    """One round trip of a normal client (seconds); fails if the server does not answer in 10 s."""
    start = time.monotonic()
    backend = GrpcBackend(address, "healthy", call_timeout=10, retry_timeout=2)
    backend.add("calls", 1)
    return time.monotonic() - start


@pytest.mark.parametrize("attack", fuzz.ATTACKS, ids=lambda a: a.__name__)
def test_an_attack_leaves_the_server_serving(server: ServerProcess, attack: fuzz.Attack) -> None:
    served(server.address)
    attack("127.0.0.1", server.port, random.Random(1))
    assert server.alive(), "the server died"
    assert served(server.address) < 10
    assert "Traceback" not in server.stderr(), server.stderr()


def test_1000_idle_connections_do_not_stop_other_clients(server: ServerProcess) -> None:
    served(server.address)
    before = rss_mib(server.proc.pid)
    held = fuzz.idle_connections("127.0.0.1", server.port, 1000)
    try:
        # a client keeps being served while the idle connections are held, and a watch still wakes
        assert served(server.address) < 10
        b = GrpcBackend(server.address, "healthy")
        woke: list[bool] = []
        t = threading.Thread(target=lambda: woke.append(b.watch("w", version=None, timeout=30)))
        t.start()
        time.sleep(0.2)
        GrpcBackend(server.address, "healthy").set("w", 1)
        t.join(30)
        assert woke == [True]
        grown = rss_mib(server.proc.pid) - before
    finally:
        for s in held:
            with contextlib.suppress(OSError):
                s.close()
    assert server.alive()
    assert grown < 256, f"1000 idle connections cost the server {grown:.0f} MiB"


def test_memory_stays_bounded_under_repeated_attacks(server: ServerProcess) -> None:
    rng = random.Random(2)
    for attack in fuzz.ATTACKS:  # warm up (first allocations of every path)
        attack("127.0.0.1", server.port, rng)
    base = rss_mib(server.proc.pid)
    for _ in range(3):
        for attack in fuzz.ATTACKS:
            attack("127.0.0.1", server.port, rng)
    assert server.alive()
    assert served(server.address) < 10
    grown = rss_mib(server.proc.pid) - base
    assert grown < 64, f"the server grew by {grown:.0f} MiB over three rounds of attacks"
