"""The etcd test servers themselves: a port taken between choosing it and binding it is not a failure."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from rallypoint_etcd import testing
from rallypoint_etcd.testing import EtcdCluster, EtcdServer


@pytest.fixture
def taken() -> Iterator[int]:
    """A port that something else listens on (as a port taken right after it was chosen)."""
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        yield int(blocker.getsockname()[1])


def _first_choice(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    real = testing.free_port
    choices = iter([port])
    monkeypatch.setattr(testing, "free_port", lambda: next(choices, None) or real())


def test_a_server_whose_chosen_port_was_taken_starts_on_another(monkeypatch: pytest.MonkeyPatch, taken: int) -> None:
    _first_choice(monkeypatch, taken)  # the client port
    with EtcdServer() as server:
        assert server.client_port != taken
        assert server.healthy()


def test_a_cluster_whose_chosen_port_was_taken_starts_on_new_ones(monkeypatch: pytest.MonkeyPatch, taken: int) -> None:
    _first_choice(monkeypatch, taken)  # the first member's peer port
    with EtcdCluster(3) as cluster:
        assert all(m.peer_port != taken for m in cluster.members)
        assert all(m.healthy() for m in cluster.members)
        cluster.leader()


def test_chosen_ports_lie_below_the_ephemeral_range() -> None:
    start = testing._ephemeral_start()
    ports = [testing.free_port() for _ in range(20)]
    if start > testing._SERVER_PORTS[0]:
        assert all(testing._SERVER_PORTS[0] <= p < start for p in ports), ports
