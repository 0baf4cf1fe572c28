"""Why a gRPC connection failed at TLS, in words: found by trying the handshake with Python's ``ssl``.

gRPC reports most TLS failures as an unreachable server: "failed to connect to all addresses;
last error: UNAVAILABLE: ipv4:10.0.0.5:29400: Socket closed" when a plain client meets a TLS
server or a mutual-TLS server refuses the client's certificate, "Tls handshake failed ...
CERTIFICATE_VERIFY_FAILED" or "Hostname Verification Check failed" otherwise. After the retries of
a call have failed, :func:`tls_failure` reads those details and, where they do not say, makes one
TLS handshake of its own with the client's settings (at most ``timeout`` seconds) to tell which
side speaks TLS and who closed the connection. It imports no grpc.
"""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING

from rallypoint_grpc.endpoints import parse_endpoint

if TYPE_CHECKING:
    from rallypoint_grpc.transport import TlsFiles

__all__ = ["tls_failure"]

#: Said in details of failures that are about TLS, or that may hide a TLS failure ("Socket closed").
_TLS_HINTS = ("Socket closed", "handshake", "Handshake", "SSL", "TSI_", "Hostname Verification", "Connection reset")


def tls_failure(endpoint: str, tls: TlsFiles | None, details: str, timeout: float = 2.0) -> str | None:
    """Why connecting to ``endpoint`` failed at TLS, and what to change; ``None`` when TLS is not the cause.

    Args:
        endpoint: ``HOST:PORT`` of the server.
        tls: the client's TLS files (``None``: the client speaks plain TCP).
        details: gRPC's description of the failure.
        timeout: the longest the handshake tried here may take.
    """
    if not any(hint in details for hint in _TLS_HINTS):
        return None  # refused, unresolvable, timed out: the server is not there, TLS or not
    host, port = parse_endpoint(endpoint)
    name = (tls.server_name if tls is not None else None) or host
    if tls is not None:
        said = _from_details(details, tls, name)
        if said is not None:
            return said
    try:
        return _handshake(host, port, tls, name, timeout)
    except OSError:
        return None  # the server is gone: not a TLS matter


def _from_details(details: str, tls: TlsFiles, name: str) -> str | None:
    if "Hostname Verification" in details:
        return f"the server's certificate does not name {name!r}: set tls_server_name to a name it holds"
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return f"the server's certificate is not signed by tls_ca ({tls.ca}): give the CA that signed it"
    if "WRONG_VERSION_NUMBER" in details:
        return _PLAIN_SERVER
    return None


_PLAIN_SERVER = (
    "the server does not speak TLS: remove tls_ca, or start the server with a certificate (tls_cert, tls_key)"
)


def _context(tls: TlsFiles | None) -> ssl.SSLContext:
    if tls is None:  # only to learn whether the server speaks TLS
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=tls.ca)
        if tls.cert is not None:
            context.load_cert_chain(tls.cert, tls.key)
    context.set_alpn_protocols(["h2"])  # a gRPC server closes a connection that does not offer HTTP/2
    return context


def _handshake(host: str, port: int, tls: TlsFiles | None, name: str, timeout: float) -> str | None:
    """The client's handshake, made here: what went wrong, or ``None`` when the TLS side is fine."""
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            _context(tls).wrap_socket(raw, server_hostname=name) as conn,
        ):
            conn.settimeout(timeout)
            first = conn.recv(1)  # a gRPC server speaks first (HTTP/2 settings); one that refuses us closes
    except ssl.SSLCertVerificationError as exc:
        return _from_details(f"CERTIFICATE_VERIFY_FAILED {exc.verify_message}", tls, name) if tls else None
    except ssl.SSLError as exc:
        if tls is not None and exc.reason == "WRONG_VERSION_NUMBER":
            return _PLAIN_SERVER
        if tls is not None and exc.reason and "ALERT" in exc.reason:
            return _refused_certificate(tls, exc.reason)
        return None  # a plain client's look at a plain server, or a failure TLS does not explain
    except TimeoutError:
        return None
    if tls is None:
        return "the server speaks TLS and this node does not: set tls_ca to the CA that signed the server's certificate"
    if first:
        return None
    return _refused_certificate(tls, "it closed the connection after the handshake")


def _refused_certificate(tls: TlsFiles, what: str) -> str:
    if tls.cert is None:
        return (
            f"the server requires a client certificate (mutual TLS; {what}): set mutual_tls = true with tls_cert "
            "and tls_key"
        )
    return (
        f"the server refused this node's client certificate {tls.cert} ({what}): give one signed by the CA "
        "the server trusts"
    )
