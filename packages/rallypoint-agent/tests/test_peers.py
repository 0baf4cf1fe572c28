"""vanished_peer (a worker failure caused by a dead peer host is a membership change) and running_status."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from rallypoint.agent.peers import running_status, vanished_peer
from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

FAST = RendezvousTimeouts(join=20, last_call=0.1, close=5, heartbeat_interval=0.1, heartbeat_timeout=1)


class Mortal(MemoryBackend):
    """A memory backend whose node can die: once ``dead`` is set, its heartbeat writes fail."""

    dead = False

    def set(self, key: str, value: Any, **kwargs: Any) -> Any:
        if self.dead and key.startswith("hb/"):
            raise ConnectionError("this host is gone")
        return super().set(key, value, **kwargs)


def two_members() -> tuple[RendezvousHandler, RendezvousHandler, Mortal, RendezvousResult]:
    run_id = f"peers-{uuid.uuid4().hex[:8]}"
    peer_backend = Mortal(run_id)
    me = RendezvousHandler(MemoryBackend(run_id), make_node(0), min_nodes=2, max_nodes=2, timeouts=FAST)
    peer = RendezvousHandler(peer_backend, make_node(1), min_nodes=2, max_nodes=2, timeouts=FAST)
    thread = threading.Thread(target=peer.next_rendezvous)
    thread.start()
    result = me.next_rendezvous()
    thread.join(timeout=20)
    return me, peer, peer_backend, result


def test_every_peer_alive_means_the_failure_is_the_workers_own() -> None:
    me, peer, _, result = two_members()
    try:
        started = time.monotonic()
        assert vanished_peer(me, result) is None
        # decided as soon as the peer's heartbeat moved: about one interval, not heartbeat_timeout
        assert time.monotonic() - started < FAST.heartbeat_timeout
    finally:
        peer.shutdown()
        me.shutdown()


def test_a_peer_whose_heartbeat_stopped_is_a_membership_change() -> None:
    me, peer, peer_backend, result = two_members()
    try:
        peer_backend.dead = True
        started = time.monotonic()
        why = vanished_peer(me, result)
        assert why is not None
        assert "node1" in why
        assert FAST.heartbeat_timeout * 0.5 <= time.monotonic() - started <= FAST.heartbeat_timeout + 5
    finally:
        peer.shutdown()
        me.shutdown()


def test_a_closed_job_is_left_to_the_usual_failure_path() -> None:
    me, peer, peer_backend, result = two_members()
    try:
        peer_backend.dead = True
        me.set_closed("job failed (closed by node 'node1')", failed=True)
        assert vanished_peer(me, result) is None
    finally:
        peer.shutdown()
        me.shutdown()


def test_a_single_node_round_has_no_peer_to_lose() -> None:
    run_id = f"peers-{uuid.uuid4().hex[:8]}"
    me = RendezvousHandler(MemoryBackend(run_id), make_node(0), min_nodes=1, max_nodes=1, timeouts=FAST)
    try:
        assert vanished_peer(me, me.next_rendezvous()) is None
    finally:
        me.shutdown()


class Unreachable(MemoryBackend):
    """A memory backend whose reads fail while ``down`` is set (a rendezvous server restarting)."""

    down = False

    def list(self, prefix: str) -> Any:
        if self.down:
            raise RendezvousBackendError("rendezvous server unreachable")
        return super().list(prefix)

    def get(self, key: str) -> Any:
        if self.down:
            raise RendezvousBackendError("rendezvous server unreachable")
        return super().get(key)


def test_the_status_while_workers_run_is_none_while_the_backend_does_not_answer() -> None:
    run_id = f"peers-{uuid.uuid4().hex[:8]}"
    backend = Unreachable(run_id)
    me = RendezvousHandler(backend, make_node(0), min_nodes=1, max_nodes=1, timeouts=FAST)
    try:
        me.next_rendezvous()
        backend.down = True
        assert running_status(me) is None  # the workers go on; the heartbeat decides the node's fate
        backend.down = False
        status = running_status(me)
        assert status is not None
        assert not status.closed
    finally:
        me.shutdown()
