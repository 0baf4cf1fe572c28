"""tools/bench/tcp_bytes.py: the bytes this process's connections to a port received and sent."""

from __future__ import annotations

import socket
import time

from tools.bench.tcp_bytes import tcp_bytes


def test_counts_the_bytes_of_connections_to_the_port_only() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_server(("127.0.0.1", 0)) as other:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        elsewhere = socket.create_connection(other.getsockname())
        peer, _ = server.accept()
        far, _ = other.accept()
        try:
            peer.sendall(b"x" * 12345)
            far.sendall(b"z" * 999)
            got = 0
            while got < 12345:
                got += len(client.recv(65536))
            client.sendall(b"y" * 777)
            deadline = time.monotonic() + 5
            while True:  # the acknowledgement of what the client sent comes a moment later
                counts = tcp_bytes(port)
                if list(counts.values()) == [(12345, 777)] or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            # the server's own accepted socket has port as its local port, not its peer: not counted
            assert list(counts.values()) == [(12345, 777)]
        finally:
            for s in (client, elsewhere, peer, far):
                s.close()
