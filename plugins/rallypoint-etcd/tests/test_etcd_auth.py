"""etcd with authentication on: a user whose role may write the rallypoint prefix only."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint_etcd.backend import EtcdBackend
from rallypoint_etcd.options import EtcdOptions
from rallypoint_etcd.testing import EtcdServer, etcd_binary

PASSWORD_ENV = "RP_TEST_ETCD_PASSWORD"


def etcdctl(server: EtcdServer, *args: str) -> None:
    ctl = str(Path(etcd_binary()).with_name("etcdctl"))
    subprocess.run([ctl, f"--endpoints={server.endpoint}", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def secured() -> Iterator[EtcdServer]:
    """An etcd with auth on: root, and user ``rp`` (password ``rp-pw``) with readwrite on /rallypoint/."""
    with EtcdServer() as server:
        etcdctl(server, "user", "add", "root:root-pw")
        etcdctl(server, "user", "add", "rp:rp-pw")
        etcdctl(server, "role", "add", "rp")
        etcdctl(server, "role", "grant-permission", "rp", "--prefix=true", "readwrite", "/rallypoint/")
        etcdctl(server, "user", "grant-role", "rp", "rp")
        etcdctl(server, "auth", "enable", "--user=root:root-pw")
        yield server


@pytest.mark.slow
def test_a_user_with_a_password_from_the_environment(secured: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "rp-pw")
    opts = EtcdOptions(endpoints=[secured.endpoint], username="rp", password_env=PASSWORD_ENV, retry_timeout=10)
    a, b = EtcdBackend("auth", opts), EtcdBackend("auth", opts)
    v = a.set("k", {"x": 1})
    assert b.get("k") is not None
    assert b.add("n") == 1
    ok, _ = b.compare_and_set("k", 2, version=v)
    assert ok
    assert a.watch("k", version=v, timeout=5)
    assert set(a.list("")) == {"k", "n"}
    # a restart forgets the login tokens: the clients log in again by themselves
    secured.stop()
    secured.start()
    assert a.add("n") == 2
    assert b.get("n") is not None


@pytest.mark.slow
def test_a_wrong_password_or_a_foreign_prefix_is_refused_clearly(
    secured: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "wrong")
    opts = EtcdOptions(endpoints=[secured.endpoint], username="rp", password_env=PASSWORD_ENV, retry_timeout=3)
    with pytest.raises(RendezvousBackendError, match=r"etcd refused to connect.*authentication failed"):
        EtcdBackend("auth", opts)
    monkeypatch.setenv(PASSWORD_ENV, "rp-pw")
    foreign = opts.model_copy(update={"prefix": "/elsewhere"})
    with pytest.raises(RendezvousBackendError, match=r"etcd refused to .*permission denied"):
        EtcdBackend("auth", foreign)
