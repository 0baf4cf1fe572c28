"""Test certificates made at test time with the ``openssl`` command: a CA, a server, clients."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)  # fmt: skip


def _signed(d: Path, ca: str, name: str, san: str) -> None:
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)  # fmt: skip


@dataclass(frozen=True)
class Certs:
    """Paths of the PEM files."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate of another CA
    rogue_key: Path


def make_certs(d: Path) -> Certs:
    """A CA with a server certificate (127.0.0.1, localhost) and a client one, plus a rogue client."""
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "rogue-ca")
    _signed(d, "ca", "server", "IP:127.0.0.1,DNS:localhost")
    _signed(d, "ca", "client", "DNS:client")
    _signed(d, "rogue-ca", "rogue", "DNS:rogue")
    return Certs(d, d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
                 d / "rogue.pem", d / "rogue.key")  # fmt: skip
