"""``HOST:PORT`` endpoints of both wings: parsing and writing them, ``[v6]:PORT`` too. No grpc import here."""

from __future__ import annotations

__all__ = ["format_endpoint", "parse_endpoint"]


def parse_endpoint(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (or ``[IPv6]:PORT``) into host and port.

    Raises:
        ValueError: no port, a port outside 0-65535, or an empty host.
    """
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid endpoint {text!r}: expected HOST:PORT (e.g. node0:29400 or [::1]:29400)")
    return host, int(port)


def format_endpoint(host: str, port: int) -> str:
    """``HOST:PORT``, with brackets around an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
