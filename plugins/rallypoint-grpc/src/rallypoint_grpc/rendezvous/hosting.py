"""The agent-hosted rendezvous server: the agent whose host the endpoint names serves it.

With ``serve = "auto"`` (:func:`host_server`), when the endpoint's address belongs to this host
and its port is free, this process starts the server on that address (that interface only)
before connecting to it; the other agents connect. At exit it keeps serving until the other
nodes have been quiet for a second (``linger`` at most).
"""

from __future__ import annotations

import atexit
import errno
import ipaddress
import logging
import socket
import threading
import time
from typing import Any

from rallypoint_grpc.endpoints import parse_endpoint
from rallypoint_grpc.rendezvous.options import GrpcOptions
from rallypoint_grpc.transport import TlsFiles

__all__ = ["host_server"]

log = logging.getLogger("rallypoint_grpc.rendezvous.backend")

_HOSTED: dict[str, Any] = {}
_HOSTED_LOCK = threading.Lock()


def _local_address(host: str, port: int) -> str | None:
    """The endpoint's IP address if it belongs to this host and ``port`` is free there, else ``None``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return None
    family, _, _, _, sockaddr = infos[0]
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(sockaddr)
    except OSError as exc:
        if exc.errno not in (errno.EADDRNOTAVAIL, errno.EADDRINUSE, errno.EACCES):
            log.debug("cannot bind %s: %s", sockaddr, exc)
        return None
    finally:
        probe.close()
    return str(sockaddr[0])


def _own_address_too(host: str, bound: str) -> tuple[str, ...]:
    """The host's routable address, when the endpoint names this host by a name that maps to loopback.

    On many cloud images a host's own name resolves to 127.0.0.1 there and to its real address
    everywhere else: the endpoint ``node0:29400`` then means loopback to the agent on node0 and
    node0's address to the others. The server binds both, so agents on this host (which
    resolve the name to loopback) and on the others reach it.
    """
    from rallypoint.rendezvous.netif import is_loopback, routable_address

    try:
        ipaddress.ip_address(host)
        return ()  # an address, not a name: it means what it says
    except ValueError:
        pass
    if host == "localhost" or not is_loopback(bound):
        return ()
    route = routable_address()
    if route is None:
        log.warning(
            "the endpoint's host %r resolves to %s here, and this host has several addresses besides loopback: "
            "serving on %s only; give the endpoint as this host's IP address",
            host,
            bound,
            bound,
        )
        return ()
    return (route.address,)


def _linger(server: Any, limit: float) -> None:
    """At exit, keep serving until the other nodes have been quiet for a second (``limit`` at most)."""
    deadline = time.monotonic() + limit
    last = -1
    while time.monotonic() < deadline:
        calls = server.service.calls if server.service is not None else 0
        if calls == last:
            break
        last = calls
        time.sleep(1.0)
    server.stop()


def host_server(opts: GrpcOptions, token: str | None) -> Any | None:
    """Start the server in this process when the endpoint is ours (see the module text).

    Returns the running :class:`~rallypoint_grpc.rendezvous.server.RendezvousServer`, or ``None``
    when another process serves (or will: the address is not on this host, or the port is taken).
    """
    from rallypoint_grpc.rendezvous.server import RendezvousServer, ServerConfig

    with _HOSTED_LOCK:
        if opts.endpoint in _HOSTED:
            return _HOSTED[opts.endpoint]
        host, port = parse_endpoint(opts.endpoint)
        address = _local_address(host, port)
        if address is None:
            return None
        tls = None
        if opts.tls:
            if opts.tls_cert is None:
                log.info("not hosting %s: TLS is on but this node has no tls_cert/tls_key", opts.endpoint)
                return None
            tls = TlsFiles(cert=opts.tls_cert, key=opts.tls_key, ca=opts.tls_ca if opts.mutual_tls else None)
        also = _own_address_too(host, address)
        config = ServerConfig(
            address,
            port,
            token=token,
            tls=tls,
            data_dir=opts.data_dir,
            max_message_bytes=opts.max_message_bytes,
            also=also,
        )
        try:
            server = RendezvousServer(config).start()
        except OSError as exc:  # another agent bound it first
            log.debug("not hosting %s: %s", opts.endpoint, exc)
            return None
        log.info("hosting the rendezvous server on %s", server.address)
        _HOSTED[opts.endpoint] = server
        atexit.register(_linger, server, opts.linger)
        return server
