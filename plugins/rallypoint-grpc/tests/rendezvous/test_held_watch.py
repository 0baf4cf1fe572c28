"""The held watch of the gRPC backend: a node's first wait reads nothing before or after it.

The server compares the key with the version the waiter holds when the watch stream opens, so a
held watch needs no stream until the wait; the change it reports carries the key's entry, so a
node woken by the complete round header reads nothing more (see
:class:`~rallypoint.rendezvous.backend.SupportsHeldWatch`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rallypoint.rendezvous.backend import SupportsHeldWatch
from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult
from rallypoint.rendezvous.roster import ROSTERS
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts
from rallypoint_grpc._proto import rendezvous_pb2 as pb
from rallypoint_grpc.rendezvous.backend import GrpcBackend
from rallypoint_grpc.rendezvous.server import RendezvousServer, RendezvousService, ServerConfig

from .recording import RecordingBackend


@pytest.fixture
def server() -> Iterator[RendezvousServer]:
    server = RendezvousServer(ServerConfig()).start()
    yield server
    server.stop()


def test_the_change_comes_with_the_keys_entry(server: RendezvousServer) -> None:
    run_id = f"held-{uuid.uuid4().hex[:8]}"
    backend, other = GrpcBackend(server.address, run_id), GrpcBackend(server.address, run_id)
    assert isinstance(backend, SupportsHeldWatch)
    seen = backend.set("header", {"round": 0})
    held = backend.hold_watch("header", timeout=10)
    newer = other.set("header", {"round": 1})
    change = held.wait(seen)
    held.close()
    assert change is not None
    assert change.entry is not None
    assert (change.entry.value, change.entry.version) == ({"round": 1}, newer)


def test_a_server_that_sends_no_entry_leaves_the_read_to_the_caller(
    monkeypatch: pytest.MonkeyPatch, no_sessions: None
) -> None:
    async def older(self: Any, request: Any, context: Any) -> Any:  # a server from before the entry
        yield pb.WatchEvent(changed=True)

    monkeypatch.setattr(RendezvousService, "Watch", older)  # before the server registers its methods
    server = RendezvousServer(ServerConfig()).start()
    try:
        backend = GrpcBackend(server.address, f"held-{uuid.uuid4().hex[:8]}")
        held = backend.hold_watch("header", timeout=10)
        started = time.monotonic()
        change = held.wait(None)
    finally:
        server.stop()
    assert time.monotonic() - started < 5
    assert change is not None
    assert change.entry is None  # unknown: the handler reads


def test_a_waiting_node_sends_nothing_but_its_watch_after_its_join(server: RendezvousServer) -> None:
    """It used to read the round again once woken (a List per waiting node, all at once), and to
    check in with three calls (the round's listing, the claim of the run id, the ticket)."""
    ROSTERS.clear()
    run_id = f"held-{uuid.uuid4().hex[:8]}"
    timeouts = RendezvousTimeouts(join=60, last_call=30, close=5, heartbeat_interval=30, heartbeat_timeout=60)
    recording = RecordingBackend(server.address, run_id)
    waiting = RendezvousHandler(recording, make_node(0), min_nodes=2, max_nodes=2, timeouts=timeouts)
    completing = RendezvousHandler(
        GrpcBackend(server.address, run_id), make_node(1), min_nodes=2, max_nodes=2, timeouts=timeouts
    )
    results: list[RendezvousResult] = []
    try:
        t = threading.Thread(target=lambda: results.append(waiting.next_rendezvous()))
        t.start()
        time.sleep(1.0)  # it joins and waits
        results.append(completing.next_rendezvous())
        t.join(20)
        assert not t.is_alive()
        calls = list(recording.calls)
    finally:
        waiting.shutdown()
        completing.shutdown()
    assert sorted(r.group_rank for r in results) == [0, 1]
    joined = calls.index("CreateAndAdd")
    assert calls[joined + 1 :] == ["Watch"], calls
    # and before it, one call: the check-in reads the round, claims the run id and takes a ticket
    assert calls[:joined] == ["CheckIn"], calls
