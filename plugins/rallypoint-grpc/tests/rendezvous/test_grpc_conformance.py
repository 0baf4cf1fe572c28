"""The grpc backend against the conformance kit, with a real server in another process."""

from __future__ import annotations

import pytest

from rallypoint.rendezvous.testing import (
    HeldWatchConformance,
    MultiProcessBackendConformance,
    MultiProcessHandlerConformance,
    SetManyConformance,
    WaitWithConformance,
)
from rallypoint_grpc.rendezvous.backend import GrpcBackend

from .conftest import ServerProcess


class GrpcFactory:
    """Picklable: every call (in any process) opens a client of the same server."""

    def __init__(self, address: str) -> None:
        self.address = address

    def __call__(self, run_id: str) -> GrpcBackend:
        return GrpcBackend(self.address, run_id, call_timeout=30.0)


class TestGrpcBackend(HeldWatchConformance, SetManyConformance, WaitWithConformance, MultiProcessBackendConformance):
    @pytest.fixture
    def backend_factory(self, server: ServerProcess) -> GrpcFactory:
        return GrpcFactory(server.address)


class TestGrpcHandler(MultiProcessHandlerConformance):
    @pytest.fixture
    def backend_factory(self, server: ServerProcess) -> GrpcFactory:
        return GrpcFactory(server.address)
