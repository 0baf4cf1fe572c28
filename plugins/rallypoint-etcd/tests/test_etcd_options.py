"""``[rendezvous.options]`` of the etcd backend: validation with the key named, and the record."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint_etcd.options import EtcdOptions, parse_endpoint


def errors(**raw: object) -> str:
    with pytest.raises(ValidationError) as err:
        EtcdOptions.model_validate(raw)
    return str(err.value)


def test_defaults() -> None:
    opts = EtcdOptions()
    assert opts.endpoints == ["127.0.0.1:2379"]
    assert (opts.prefix, opts.namespace, opts.key_ttl, opts.tls) == ("/rallypoint", None, 60, False)
    assert opts.base_key("job") == "/rallypoint/job/"
    assert EtcdOptions(prefix="/a/b/", namespace="team").base_key("job") == "/a/b/team/job/"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("10.0.0.5:2379", ("10.0.0.5", 2379, None)),
        ("etcd-1", ("etcd-1", 2379, None)),
        ("http://etcd-1:12379/", ("etcd-1", 12379, False)),
        ("https://etcd-1:2379", ("etcd-1", 2379, True)),
        ("[::1]:2379", ("::1", 2379, None)),
        ("http://[::1]", ("::1", 2379, False)),
    ],
)
def test_endpoints_parse(text: str, parsed: tuple[str, int, bool | None]) -> None:
    assert parse_endpoint(text) == parsed


def test_endpoints_from_a_comma_separated_string() -> None:
    assert EtcdOptions.model_validate({"endpoints": "a:1, b:2,"}).endpoints == ["a:1", "b:2"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"endpoints": []}, "endpoints"),
        ({"endpoints": ["host:port"]}, "port 'port' is not a number"),
        ({"endpoints": ["host:70000"]}, "out of range"),
        ({"endpoints": ["http://[::1"]}, "is not [IPv6]:PORT (e.g. [::1]:2379): check the brackets"),
        ({"endpoints": ["[::1]2379"]}, "check the brackets"),
        ({"endpoints": ["https://h:1"]}, "https:// endpoints need tls_ca"),
        ({"prefix": "relative"}, "prefix 'relative' must start with '/'"),
        ({"prefix": "/a/../b"}, "prefix"),
        ({"namespace": "a/b"}, "namespace 'a/b' must be one segment"),
        ({"password_env": "hunter2!", "username": "u"}, "NAME of an environment variable"),
        ({"username": "u"}, "username and password_env go together"),
        ({"tls_cert": "c.pem"}, "tls_cert and tls_key go together"),
        ({"tls_cert": "c.pem", "tls_key": "k.pem"}, "tls_cert needs tls_ca"),
        ({"key_ttl": 1}, "key_ttl"),
        ({"endpoint": "h:1"}, "endpoint"),  # a typo of endpoints: unknown keys are refused
    ],
)
def test_bad_options_name_the_key(raw: dict[str, object], message: str) -> None:
    assert message in errors(**raw)


def test_the_password_comes_from_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RP_TEST_ETCD_PW", "s3cret")
    opts = EtcdOptions(username="rp", password_env="RP_TEST_ETCD_PW")
    assert opts.password() == "s3cret"
    assert "s3cret" not in opts.model_dump_json()
    monkeypatch.delenv("RP_TEST_ETCD_PW")
    with pytest.raises(ValueError, match="'RP_TEST_ETCD_PW', which is not set"):
        opts.password()


def test_an_unset_password_variable_is_refused_with_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RP_TEST_ETCD_PW", raising=False)
    message = errors(endpoints=["127.0.0.1:1"], username="rp", password_env="RP_TEST_ETCD_PW")
    assert "the variable RP_TEST_ETCD_PW (etcd password of user 'rp') is not set in this environment" in message


@pytest.mark.parametrize("make", ["missing", "directory", "not-pem", "empty"])
def test_an_unreadable_tls_file_is_refused_with_the_job(tmp_path: Path, make: str) -> None:
    path = tmp_path / "ca.pem"
    if make == "directory":
        path.mkdir()
    elif make == "not-pem":
        path.write_text("hello")
    elif make == "empty":
        path.write_text("")
    said = {
        "missing": "cannot read the CA bundle",
        "directory": "is a directory, not a file",
        "not-pem": "is not a PEM file",
        "empty": "is empty",
    }
    message = errors(endpoints=["https://127.0.0.1:1"], tls_ca=str(path))
    assert said[make] in message
    assert "tls_ca must name a readable PEM file on every node" in message


def test_an_unset_password_variable_fails_when_the_backend_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    from rallypoint_etcd.backend import EtcdBackend

    monkeypatch.setenv("RP_TEST_ETCD_PW", "s3cret")
    opts = EtcdOptions(endpoints=["127.0.0.1:1"], username="rp", password_env="RP_TEST_ETCD_PW")
    monkeypatch.delenv("RP_TEST_ETCD_PW")  # gone between the check of the job and the start
    with pytest.raises(RendezvousBackendError, match="RP_TEST_ETCD_PW"):
        EtcdBackend("job", opts)


def test_an_unreadable_tls_file_fails_when_the_backend_opens(tmp_path: Path) -> None:
    from rallypoint_etcd.backend import EtcdBackend

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    opts = EtcdOptions(endpoints=["https://127.0.0.1:1"], tls_ca=str(ca))
    ca.unlink()  # gone between the check of the job and the start
    expected = r"rendezvous\.options\.tls_ca = .*ca\.pem.* cannot be read on this node \(missing\)"
    with pytest.raises(RendezvousBackendError, match=expected):
        EtcdBackend("job", opts)


def test_an_unreachable_etcd_fails_when_the_backend_opens_naming_the_endpoints() -> None:
    from rallypoint_etcd.backend import EtcdBackend
    from rallypoint_etcd.testing import free_port

    ports = [free_port(), free_port()]
    opts = EtcdOptions(endpoints=[f"127.0.0.1:{p}" for p in ports], retry_timeout=0.5, connect_timeout=0.5)
    with pytest.raises(RendezvousBackendError, match="etcd unreachable") as err:
        EtcdBackend("job", opts)
    assert all(f"127.0.0.1:{p}" in str(err.value) for p in ports)


def test_the_backend_is_registered() -> None:
    from rallypoint.core.plugins import get_plugin_manager
    from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS

    record = get_plugin_manager().registry(RENDEZVOUS_BACKENDS).get("etcd")
    assert record.options_model is EtcdOptions
    assert record.endpoint_option == "endpoints"
    assert record.multi_host
