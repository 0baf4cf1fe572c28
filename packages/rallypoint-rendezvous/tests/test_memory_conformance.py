"""The memory backend against the conformance kit."""

from __future__ import annotations

import pytest

from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.testing import (
    BackendConformance,
    HandlerConformance,
    SetManyConformance,
    WaitWithConformance,
)


class MemoryFactory:
    """Every call returns a new client of the shared in-process space of ``run_id``."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def __call__(self, run_id: str) -> MemoryBackend:
        return MemoryBackend(run_id, namespace=self.namespace)


@pytest.fixture
def memory_factory(request: pytest.FixtureRequest) -> MemoryFactory:
    return MemoryFactory(request.node.nodeid)


class TestMemoryBackend(SetManyConformance, WaitWithConformance, BackendConformance):
    @pytest.fixture
    def backend_factory(self, memory_factory: MemoryFactory) -> MemoryFactory:
        return memory_factory


class TestMemoryHandler(HandlerConformance):
    @pytest.fixture
    def backend_factory(self, memory_factory: MemoryFactory) -> MemoryFactory:
        return memory_factory
