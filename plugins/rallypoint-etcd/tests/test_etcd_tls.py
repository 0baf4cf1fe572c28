"""etcd serving clients over TLS with client certificates required."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint_etcd.backend import EtcdBackend
from rallypoint_etcd.options import EtcdOptions
from rallypoint_etcd.testing import EtcdServer, EtcdTLS, make_test_certificates


@pytest.fixture
def tls(tmp_path: Path) -> EtcdTLS:
    return make_test_certificates(tmp_path / "pki")


@pytest.fixture
def tls_server(tls: EtcdTLS) -> Iterator[EtcdServer]:
    with EtcdServer(tls=tls) as server:
        yield server


@pytest.mark.slow
def test_tls_with_a_client_certificate(tls: EtcdTLS, tls_server: EtcdServer) -> None:
    opts = EtcdOptions(
        endpoints=[f"https://{tls_server.endpoint}"],
        tls_ca=tls.ca,
        tls_cert=tls.client_cert,
        tls_key=tls.client_key,
        retry_timeout=5,
    )
    a, b = EtcdBackend("tls", opts), EtcdBackend("tls", opts)
    v = a.set("k", [1, 2])
    got = b.get("k")
    assert got is not None
    assert got.value == [1, 2]
    assert b.add("n", 2) == 2
    assert a.watch("k", version=v, timeout=0.2) is False
    b.set("k", 3)
    assert a.watch("k", version=v, timeout=5)


@pytest.mark.slow
def test_tls_without_the_client_certificate_is_refused(tls: EtcdTLS, tls_server: EtcdServer) -> None:
    opts = EtcdOptions(endpoints=[f"https://{tls_server.endpoint}"], tls_ca=tls.ca, retry_timeout=2, connect_timeout=1)
    with pytest.raises(RendezvousBackendError, match=tls_server.endpoint):
        EtcdBackend("tls", opts)
