"""A standalone server restarted with --data-dir loses nothing; a running job does not notice."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult
from rallypoint.rendezvous.keyspace import HEADER_KEY
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts
from rallypoint_grpc.rendezvous.backend import GrpcBackend

from .conftest import ServerProcess

TIMEOUTS = RendezvousTimeouts(join=30.0, last_call=0.2, close=10.0, heartbeat_interval=0.2, heartbeat_timeout=8.0)


def restart(start_server: type[ServerProcess], server: ServerProcess, data: Path) -> ServerProcess:
    server.kill()
    return start_server("--data-dir", str(data), port=server.port)


def test_keys_versions_and_counters_survive_a_sigkill(start_server: type[ServerProcess], tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_server("--data-dir", str(data))
    b = GrpcBackend(server.address, "persist", retry_timeout=20)
    v1 = b.set("a", {"x": [1, 2]})
    b.add("n", 41)
    b.set("gone", 1)
    assert b.delete("gone")
    b.set("lease", "held", ttl=60)
    before = b.list("")
    server = restart(start_server, server, data)
    assert b.list("") == before
    assert b.add("n", 1) == 42
    v2 = b.set("a", 2)
    assert v2 not in (v1, *[e.version for e in before.values()]), "a version was reused after the restart"
    assert b.get("gone") is None


def test_a_watch_outlives_the_restart(start_server: type[ServerProcess], tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_server("--data-dir", str(data))
    b = GrpcBackend(server.address, "watch", retry_timeout=20)
    version = b.set("k", 1)
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(b.watch("k", version=version, timeout=60)))
    waiter.start()
    time.sleep(0.3)  # let the watch reach the server (a later start only makes the test weaker)
    server = restart(start_server, server, data)
    assert waiter.is_alive(), "the watch returned when the server died"
    GrpcBackend(server.address, "watch").set("k", 2)
    waiter.join(30)
    assert woke == [True]


def test_a_running_job_survives_a_server_restart(start_server: type[ServerProcess], tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start_server("--data-dir", str(data))
    handlers = [
        RendezvousHandler(
            GrpcBackend(server.address, "job", retry_timeout=1.0),
            make_node(i),
            min_nodes=2,
            max_nodes=2,
            timeouts=TIMEOUTS,
        )
        for i in range(2)
    ]
    results: list[RendezvousResult] = []
    threads = [threading.Thread(target=lambda h=h: results.append(h.next_rendezvous())) for h in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 2
    assert results[0].round == results[1].round
    header = handlers[0].backend.get(HEADER_KEY)
    assert header is not None
    server = restart(start_server, server, data)
    assert handlers[0].backend.get(HEADER_KEY) == header, "the round header was lost"
    time.sleep(TIMEOUTS.heartbeat_timeout / 2)  # heartbeats go on against the restarted server
    time.sleep(TIMEOUTS.heartbeat_timeout / 2 + 1)  # longer than heartbeat_timeout since the kill
    for h in handlers:
        assert h.failure is None
        assert not h.round_is_over(), "the restart ended the round"
        assert h.num_nodes_waiting() == 0
    handlers[0].set_closed("done")
    assert all(h.is_closed() for h in handlers)
    for h in handlers:
        h.shutdown()
