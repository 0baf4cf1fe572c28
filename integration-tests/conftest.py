"""Fixtures of the integration tests: namespace hosts (see ``netns.py``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import netns


@pytest.fixture
def hosts() -> Iterator[Callable[..., netns.HostNetwork]]:
    """Make namespace hosts: ``net = hosts(2)``; torn down after the test, which checks it.

    Where namespaces cannot be created the test fails with the reason: CI runs as root, so a
    missing privilege is a broken CI machine, not something to skip.
    """
    netns.sweep_stale()
    made: list[netns.HostNetwork] = []

    def make(count: int, **kwargs: object) -> netns.HostNetwork:
        try:
            network = netns.HostNetwork(count, **kwargs)  # type: ignore[arg-type]
        except netns.NetnsUnavailable as exc:
            pytest.fail(f"cannot create namespace hosts: {exc}")
        made.append(network)
        return network

    yield make
    for network in made:
        network.close()
    left = netns.leftovers(os.getpid())
    assert not left, f"namespace hosts left behind: {left}"
