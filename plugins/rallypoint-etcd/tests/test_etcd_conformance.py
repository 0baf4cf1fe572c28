"""The etcd backend against the conformance kit, on a real etcd server."""

from __future__ import annotations

import pytest

from rallypoint.rendezvous.testing import (
    HeldWatchConformance,
    MultiProcessBackendConformance,
    MultiProcessHandlerConformance,
)
from rallypoint_etcd.options import EtcdOptions

from .conftest import EtcdFactory


class TestEtcdBackend(HeldWatchConformance, MultiProcessBackendConformance):
    @pytest.fixture
    def backend_factory(self, etcd_options: EtcdOptions) -> EtcdFactory:
        return EtcdFactory(etcd_options)


class TestEtcdHandler(MultiProcessHandlerConformance):
    @pytest.fixture
    def backend_factory(self, etcd_options: EtcdOptions) -> EtcdFactory:
        return EtcdFactory(etcd_options)
