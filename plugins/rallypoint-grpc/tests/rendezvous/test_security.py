"""Token, TLS and mutual TLS: an unauthenticated call is refused and changes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint.rendezvous.round_io import free_port
from rallypoint_grpc.rendezvous.backend import GrpcBackend, create_grpc_backend
from rallypoint_grpc.rendezvous.options import GrpcOptions
from rallypoint_grpc.transport import TlsFiles

from ..certs import Certs, make_certs
from .conftest import ServerProcess

TOKEN = "s3cret-token-value"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def token_server(start_server: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return start_server("--token-file", str(path))


def client(address: str, **kw: object) -> GrpcBackend:
    return GrpcBackend(address, "sec", retry_timeout=0.5, call_timeout=10, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN + "x"])
def test_calls_without_the_token_are_refused_and_change_nothing(token_server: ServerProcess, token: str | None) -> None:
    intruder = client(token_server.address, token=token)
    owner = client(token_server.address, token=TOKEN)
    owner.set("kept", "original")
    attempts = [
        lambda: intruder.set("kept", "overwritten"),
        lambda: intruder.set("new", 1),
        lambda: intruder.add("counter", 5),
        lambda: intruder.compare_and_set("new", 1, version=None),
        lambda: intruder.delete("kept"),
        lambda: intruder.get("kept"),
        lambda: intruder.list(""),
        lambda: intruder.watch("kept", version=None, timeout=5),
    ]
    for attempt in attempts:
        with pytest.raises(RendezvousBackendError, match=r"refused the call: .*token"):
            attempt()
    assert {k: e.value for k, e in owner.list("").items()} == {"kept": "original"}


def test_the_token_can_come_from_a_variable_named_in_the_job_file(
    token_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RDZV_TOKEN_FOR_TEST", TOKEN)
    backend = create_grpc_backend("sec", {"endpoint": token_server.address, "token_env": "RDZV_TOKEN_FOR_TEST"})
    assert backend.add("n", 3) == 3
    options = GrpcOptions(endpoint=token_server.address, token_env="RDZV_TOKEN_FOR_TEST")
    monkeypatch.delenv("RDZV_TOKEN_FOR_TEST")
    with pytest.raises(ValidationError, match="the variable RDZV_TOKEN_FOR_TEST \\(token\\) is not set"):
        create_grpc_backend("sec", {"endpoint": token_server.address, "token_env": "RDZV_TOKEN_FOR_TEST"})
    with pytest.raises(RendezvousBackendError, match="RDZV_TOKEN_FOR_TEST is not set"):
        create_grpc_backend("sec", options)  # validated while it was set: the backend finds it gone


def test_tls_server_serves_tls_clients_only_and_says_why_tls_failed(
    start_server: type[ServerProcess], certs: Certs
) -> None:
    # gRPC reports these as "unreachable ... Socket closed" (or a handshake failure): the error says what TLS refused
    server = start_server("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    tls = client(server.address, tls=TlsFiles(ca=str(certs.ca)))
    assert tls.add("n", 1) == 1
    with pytest.raises(
        RendezvousBackendError, match="TLS failed: the server speaks TLS and this node does not: set tls_ca"
    ):
        client(server.address).get("n")  # plain TCP client
    rogue = TlsFiles(ca=str(certs.dir / "rogue-ca.pem"))
    with pytest.raises(RendezvousBackendError, match=r"TLS failed: the server's certificate is not signed by tls_ca"):
        client(server.address, tls=rogue).get("n")  # server not trusted
    other_name = TlsFiles(ca=str(certs.ca), server_name="elsewhere")
    with pytest.raises(RendezvousBackendError, match="TLS failed: the server's certificate does not name 'elsewhere'"):
        client(server.address, tls=other_name).get("n")


def test_a_tls_client_of_a_plain_server_is_told_so(start_server: type[ServerProcess], certs: Certs) -> None:
    server = start_server()
    with pytest.raises(RendezvousBackendError, match="TLS failed: the server does not speak TLS: remove tls_ca"):
        client(server.address, tls=TlsFiles(ca=str(certs.ca))).get("n")


def test_a_server_that_is_not_there_is_still_unreachable(certs: Certs) -> None:
    with pytest.raises(RendezvousBackendError, match=r"unreachable for 0\.5 s") as info:
        client(f"127.0.0.1:{free_port()}", tls=TlsFiles(ca=str(certs.ca))).get("n")
    assert "TLS" not in str(info.value)


def test_mutual_tls_requires_a_client_certificate_of_the_ca(start_server: type[ServerProcess], certs: Certs) -> None:
    server = start_server(
        "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key), "--tls-client-ca", str(certs.ca)
    )
    good = TlsFiles(cert=str(certs.client_cert), key=str(certs.client_key), ca=str(certs.ca))
    assert client(server.address, tls=good).add("n", 1) == 1
    for bad, says in (
        (TlsFiles(ca=str(certs.ca)), "the server requires a client certificate (mutual TLS"),
        (
            TlsFiles(cert=str(certs.rogue_cert), key=str(certs.rogue_key), ca=str(certs.ca)),
            f"the server refused this node's client certificate {certs.rogue_cert}",
        ),
    ):
        with pytest.raises(RendezvousBackendError) as info:
            client(server.address, tls=bad).add("n", 1)
        assert f"TLS failed: {says}" in str(info.value)
    assert client(server.address, tls=good).get("n").value == 1  # type: ignore[union-attr]


def test_tls_with_token_and_a_server_name_override(
    start_server: type[ServerProcess], certs: Certs, tmp_path: Path
) -> None:
    token = tmp_path / "t"
    token.write_text(TOKEN)
    server = start_server(
        "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key), "--token-file", str(token)
    )
    backend = create_grpc_backend(
        "sec",
        {
            "endpoint": server.address,
            "serve": "never",
            "tls_ca": str(certs.ca),
            "tls_server_name": "localhost",
            "token_file": str(token),
        },
    )
    assert backend.set("k", [1, 2]) > 0


def test_unreadable_pem_files_are_named(certs: Certs, tmp_path: Path) -> None:
    bad = tmp_path / "not-a-pem"
    bad.write_text("hello")
    with pytest.raises(ValueError, match="not-a-pem is not a PEM file"):
        client("127.0.0.1:1", tls=TlsFiles(ca=str(bad))).get("x")
    assert os.path.exists(certs.ca)
