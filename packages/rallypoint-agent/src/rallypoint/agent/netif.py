"""Which network interface holds an address: so workers use the network the agent was given.

Gloo and NCCL's socket bootstrap pick an interface by resolving the host name; on hosts whose
name resolves to 127.0.0.1 (many cloud images) they bind loopback and a job across hosts cannot
connect. When the agent is told its address (``--local-addr``), its workers get
``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` naming the interface that holds it, unless the
user set them. Linux only (``SIOCGIFADDR`` and ``/proc/net/if_inet6``); elsewhere nothing is found
and nothing is set.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping

__all__ = ["SOCKET_IFNAME_VARIABLES", "interface_addresses", "interface_for_address", "socket_ifname_env"]

#: The variables that name the interface collective libraries bind; a user's value always wins.
SOCKET_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

_SIOCGIFADDR = 0x8915
_IF_INET6 = "/proc/net/if_inet6"


def _ipv4_of(sock: socket.socket, name: str) -> str | None:
    request = struct.pack("256s", name.encode()[:15])
    try:
        reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
    except OSError:  # no IPv4 address on this interface
        return None
    return socket.inet_ntoa(reply[20:24])


def interface_addresses() -> dict[str, list[str]]:
    """Every interface's addresses (IPv4 first address, then IPv6 ones), by interface name."""
    found: dict[str, list[str]] = {}
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            addr = _ipv4_of(sock, name)
            if addr is not None:
                found.setdefault(name, []).append(addr)
    with contextlib.suppress(OSError), open(_IF_INET6) as table:
        for line in table:
            fields = line.split()
            if len(fields) >= 6:
                packed = bytes.fromhex(fields[0])
                found.setdefault(fields[5], []).append(str(ipaddress.IPv6Address(packed)))
    return found


def interface_for_address(addr: str) -> str | None:
    """The name of the interface that holds ``addr`` (an IP address or a resolvable name).

    Returns ``None`` when no local interface holds it (or it cannot be resolved).

    Example:
        >>> interface_for_address("127.0.0.1")
        'lo'
    """
    try:
        wanted = ipaddress.ip_address(addr)
    except ValueError:
        try:
            wanted = ipaddress.ip_address(socket.getaddrinfo(addr, None)[0][4][0])
        except (OSError, ValueError, IndexError):
            return None
    for name, addresses in interface_addresses().items():
        if any(ipaddress.ip_address(a.split("%")[0]) == wanted for a in addresses):
            return name
    return None


def socket_ifname_env(interface: str | None, user_env: Mapping[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` for the workers of an agent on ``interface``.

    Args:
        interface: the interface holding the agent's ``--local-addr``
            (:func:`interface_for_address`), or ``None`` when it has none or none was given.
        user_env: variables the user set (the agent's environment and the job's ``[job] env``).

    Returns:
        Nothing for a variable the user already set, for loopback (on one host the libraries'
        own choice is right), or without an interface; else both variables naming it.

    Example:
        >>> socket_ifname_env("eth0", {"NCCL_SOCKET_IFNAME": "ib0"})
        {'GLOO_SOCKET_IFNAME': 'eth0'}
    """
    if interface is None or interface == "lo":
        return {}
    return {var: interface for var in SOCKET_IFNAME_VARIABLES if var not in user_env}
