"""Options naming TLS files, token files and token variables are checked with the job, at their key.

A missing, unreadable, empty or non-PEM file, or an unset token variable, used to pass
``config check`` and fail after start-up (an "internal error" for a TLS file). The models refuse
it now; the checks behind them are :func:`rallypoint.core.config.file_problem` and
:func:`~rallypoint.core.config.variable_problem`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from rallypoint_grpc.rendezvous.options import GrpcOptions
from rallypoint_grpc.rpc.options import GrpcRpcOptions

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "ca.pem").write_text(PEM)
    (tmp_path / "cert.pem").write_text(PEM)
    (tmp_path / "key.pem").write_text(PEM.replace("CERTIFICATE", "PRIVATE KEY"))
    (tmp_path / "token").write_text("s3cret\n")
    (tmp_path / "hello.txt").write_text("hello")
    (tmp_path / "empty").write_text(" \n")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    return {p.name: str(p) for p in tmp_path.iterdir()}


def refused(model: type[BaseModel], raw: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(raw)
    return str(info.value)


@pytest.mark.parametrize(
    ("key", "name", "says"),
    [
        ("tls_ca", "missing.pem", "cannot read the CA certificate {path}: No such file or directory"),
        ("tls_ca", "dir", "the CA certificate {path} is a directory, not a file"),
        ("tls_ca", "hello.txt", "the CA certificate {path} is not a PEM file (no '-----BEGIN' line)"),
        ("tls_ca", "empty", "the CA certificate {path} is empty"),
        ("tls_ca", "fifo", "the CA certificate {path} is a named pipe (FIFO), not a file"),
        ("token_file", "missing", "cannot read the token file {path}: No such file or directory"),
        ("token_file", "empty", "the token file {path} is empty"),
        ("token_file", "fifo", "the token file {path} is a named pipe (FIFO), not a file"),
    ],
)
def test_rendezvous_options_refuse_a_file_that_cannot_serve(
    files: dict[str, str], tmp_path: Path, key: str, name: str, says: str
) -> None:
    path = files.get(name, str(tmp_path / name))
    message = refused(GrpcOptions, {"endpoint": "node0:1", key: path})
    assert says.format(path=path) in message
    assert f"{key} must name a readable" in message


def test_the_server_certificate_and_key_are_checked_too(files: dict[str, str]) -> None:
    raw = {"endpoint": "node0:1", "tls_ca": files["ca.pem"], "tls_cert": files["cert.pem"], "tls_key": files["dir"]}
    assert "the TLS key" in refused(GrpcOptions, raw)
    raw["tls_key"] = files["key.pem"]
    assert GrpcOptions.model_validate(raw).tls_key == files["key.pem"]


def test_an_unset_or_empty_token_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RP_TEST_TOKEN", raising=False)
    raw = {"endpoint": "node0:1", "token_env": "RP_TEST_TOKEN"}
    assert "the variable RP_TEST_TOKEN (token) is not set in this environment" in refused(GrpcOptions, raw)
    monkeypatch.setenv("RP_TEST_TOKEN", " ")
    assert "the variable RP_TEST_TOKEN (token) is empty" in refused(GrpcOptions, raw)
    monkeypatch.setenv("RP_TEST_TOKEN", "s3cret")
    assert GrpcOptions.model_validate(raw).token_env == "RP_TEST_TOKEN"


def test_pairing_mistakes_are_said_before_files(files: dict[str, str]) -> None:
    # the first thing to fix is the missing half, whatever the file says
    assert "go together" in refused(GrpcOptions, {"endpoint": "node0:1", "tls_cert": "/nonexistent"})


def test_rpc_options_check_their_files(files: dict[str, str]) -> None:
    good = {"tls_ca": files["ca.pem"], "tls_cert": files["cert.pem"], "tls_key": files["key.pem"]}
    assert GrpcRpcOptions.model_validate(good).tls_ca == files["ca.pem"]
    assert "the CA certificate" in refused(GrpcRpcOptions, {**good, "tls_ca": files["dir"]})
    assert "the token file" in refused(GrpcRpcOptions, {"token_file": files["empty"]})
