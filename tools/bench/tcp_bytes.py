"""Bytes a process's TCP connections to one port received and sent, from the kernel's ``TCP_INFO``.

grpcio does not say how many bytes a call moved; the kernel does. :func:`tcp_bytes` looks through
the calling process's open file descriptors for TCP sockets connected to ``port`` and reads each
one's ``tcpi_bytes_received`` and ``tcpi_bytes_acked`` (Linux 4.1 and later): the application
bytes on the wire (gRPC's HTTP/2 frames and headers included, TCP/IP headers excluded).
"""

from __future__ import annotations

import os
import socket
import struct

__all__ = ["tcp_bytes"]

#: Offsets in Linux's ``struct tcp_info`` (include/uapi/linux/tcp.h): both ``__u64``.
_BYTES_ACKED, _BYTES_RECEIVED = 120, 128
_INFO_SIZE = 144


def tcp_bytes(port: int) -> dict[int, tuple[int, int]]:
    """``socket inode -> (bytes received, bytes sent and acknowledged)`` for this process's TCP
    sockets whose peer is ``port``. Sockets closed before the call are not counted."""
    out: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed since the listing
            continue
        if not target.startswith("socket:["):
            continue
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                peer = sock.getpeername()
            except OSError:  # a listening or unconnected socket
                continue
            if peer[1] != port:
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_SIZE)
            if len(info) < _BYTES_RECEIVED + 8:
                raise RuntimeError(f"this kernel's TCP_INFO ({len(info)} bytes) has no byte counts (Linux >= 4.1)")
            acked, received = struct.unpack_from("QQ", info, _BYTES_ACKED)
            out[int(target[8:-1])] = (received, max(acked - 1, 0))  # acked counts the SYN
        finally:
            sock.close()
    return out
