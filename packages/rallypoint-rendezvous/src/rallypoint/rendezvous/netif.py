"""Where this host is reached: its interfaces, and the address other hosts reach it at.

Many cloud images map the host's own name to 127.0.0.1, so "resolve my host name" gives an
address no other host can use (Gloo and NCCL's socket bootstrap then bind loopback, and a server
bound to that name serves loopback only). :func:`routable_address` finds the address this host
reaches a given target from (the rendezvous endpoint: the kernel's own route choice, no packet
sent), or else the host's one address besides loopback. Linux only (``SIOCGIFADDR`` and
``/proc/net/if_inet6``); elsewhere no interface is found.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "Route",
    "interface_addresses",
    "interface_for_address",
    "is_loopback",
    "name_is_loopback",
    "routable_address",
]

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


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` (an IP address) is a loopback address (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def _resolve(name: str) -> list[str]:
    try:
        return list(dict.fromkeys(str(info[4][0]) for info in socket.getaddrinfo(name, None)))
    except (OSError, UnicodeError):
        return []


def name_is_loopback(name: str) -> bool:
    """Whether ``name`` resolves to loopback addresses only (or not at all): no other host can use it."""
    return all(is_loopback(a) for a in _resolve(name))


@dataclass(frozen=True)
class Route:
    """The address other hosts reach this one at, and how it was found.

    Attributes:
        address: the IP address.
        interface: the interface that holds it (``None`` when none is found).
        how: for messages (``--dry-run``): e.g. ``"the interface that reaches node0"``.
    """

    address: str
    interface: str | None
    how: str


def _source_toward(target: str) -> str | None:
    """The local address the kernel would send from to reach ``target`` (an IP), or ``None``."""
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((target, 9))  # a datagram socket's connect only picks the route: nothing is sent
        source = str(sock.getsockname()[0])
        return None if is_loopback(source) else source
    return None


def routable_address(toward: Iterable[str] = ()) -> Route | None:
    """The address other hosts reach this one at, never loopback; ``None`` when none is found.

    Args:
        toward: hosts this one must reach (the rendezvous endpoint's host...): the address of
            the interface the kernel routes to the first one that resolves to a non-loopback
            address is taken.

    Without such a target (or when every target resolves to loopback: the endpoint names this
    very host on an image that maps its name to 127.0.0.1), the host's only non-loopback IPv4
    address, or else its only non-loopback, non-link-local IPv6 one. Several candidates and no
    target: ``None`` (the caller says which flag chooses).
    """
    for target in toward:
        for addr in _resolve(target):
            if is_loopback(addr):
                continue
            source = _source_toward(addr)
            if source is not None:
                return Route(source, interface_for_address(source), f"the interface that reaches {target}")
    candidates: dict[str, list[tuple[str, str]]] = {"v4": [], "v6": []}
    for name, addresses in interface_addresses().items():
        for addr in addresses:
            ip = ipaddress.ip_address(addr.split("%")[0])
            if ip.is_loopback or ip.is_link_local:
                continue
            candidates["v6" if ip.version == 6 else "v4"].append((name, addr))
    for family in ("v4", "v6"):
        if len(candidates[family]) == 1:
            name, addr = candidates[family][0]
            return Route(addr, name, "this host's only address besides loopback")
        if candidates[family]:
            return None
    return None
