"""A fuzzer for a gRPC rendezvous server: hostile bytes, frames and messages sent at its port.

Each attack is a function ``(host, port) -> None`` that must leave the server serving; the
tests run them against a real ``rallypoint rdzv serve`` and check, between attacks, that a
normal client is still answered. Usable by hand::

    python plugins/rallypoint-grpc/tests/fuzz.py 127.0.0.1:29400 [--seconds 30]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: A gRPC method of the service, for hand-made requests.
METHOD = "/rallypoint.rendezvous.v1.Rendezvous/Set"


def frame(kind: int, flags: int, stream: int, payload: bytes, *, length: int | None = None) -> bytes:
    """One HTTP/2 frame (``length`` may lie about the payload)."""
    n = len(payload) if length is None else length
    return struct.pack(">I", n)[1:] + bytes([kind, flags]) + struct.pack(">I", stream & 0x7FFFFFFF) + payload


@contextlib.contextmanager
def connect(host: str, port: int) -> Iterator[socket.socket]:
    """A TCP connection that is closed (with a reset, not a polite FIN) at the end."""
    s = socket.create_connection((host, port), timeout=5)
    try:
        yield s
    finally:
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


def _send(host: str, port: int, data: bytes, *, read: bool = True) -> None:
    with connect(host, port) as s, contextlib.suppress(OSError):
        s.sendall(data)
        if read:
            s.settimeout(0.5)
            s.recv(65536)


def garbage_bytes(host: str, port: int, rng: random.Random) -> None:
    """Random bytes of random length, with and without a valid HTTP/2 preface first."""
    for _ in range(20):
        junk = rng.randbytes(rng.choice([1, 7, 24, 100, 4096, 70000]))
        _send(host, port, junk if rng.random() < 0.5 else PREFACE + junk)


def truncated_frames(host: str, port: int, rng: random.Random) -> None:
    """Frames cut short, frames whose length lies, a SETTINGS frame then silence."""
    settings = frame(0x4, 0, 0, b"")
    headers = frame(0x1, 0x4, 1, rng.randbytes(40))
    cases = [
        PREFACE[:10],
        PREFACE + settings[:5],
        PREFACE + settings + headers[:12],
        PREFACE + settings + frame(0x0, 0, 1, b"\x00\x00\x00\x00\x05ab", length=16_000_000),
        PREFACE + settings + frame(0x1, 0x4, 1, b"", length=2**24 - 1),
        PREFACE + settings + frame(0x9, 0, 1, rng.randbytes(30)),  # CONTINUATION without HEADERS
        PREFACE + frame(0x4, 0, 0, b"\x00\x04\xff\xff\xff\xff"),  # window size out of range
        PREFACE + settings + frame(0x8, 0, 0, b"\x7f\xff\xff\xff") * 50,  # window update flood
        PREFACE + settings + frame(0x6, 0, 0, b"12345678") * 200,  # ping flood
    ]
    for case in cases:
        _send(host, port, case)


def oversized_and_malformed(host: str, port: int, rng: random.Random) -> None:
    """gRPC calls with bodies that are too large, not protobuf, or not JSON, and bad keys: each refused."""
    import grpc

    from rallypoint_grpc._proto import rendezvous_pb2 as pb

    big = 64 << 20
    with grpc.insecure_channel(
        f"{host}:{port}", options=[("grpc.max_send_message_length", big), ("grpc.max_receive_message_length", big)]
    ) as channel:
        raw = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        bodies = [
            rng.randbytes(100),
            b"\xff" * 10,
            pb.SetRequest(space="fuzz", key="k", value="x" * (8 << 20)).SerializeToString(),  # over the limit
            pb.SetRequest(space="fuzz", key="k", value="{not json").SerializeToString(),
            pb.SetRequest(space="fuzz", key="../../etc", value="1").SerializeToString(),
            pb.SetRequest(space="a/b", key="k", value="1").SerializeToString(),
            pb.SetRequest(space="fuzz", key="k", value="1", ttl=-5).SerializeToString(),
            pb.SetRequest(space="fuzz", key="k", value="[" * 100_000 + "]" * 100_000).SerializeToString(),
        ]
        codes = []
        for body in bodies:
            try:
                raw(body, timeout=10)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        # every one is refused; past the first two (not protobuf: gRPC itself refuses them), with
        # a status the service chose (UNKNOWN would mean an exception escaped a handler)
        assert grpc.StatusCode.OK not in codes, codes
        assert grpc.StatusCode.UNKNOWN not in codes[2:], codes
        watch = channel.unary_stream("/rallypoint.rendezvous.v1.Rendezvous/Watch")
        with contextlib.suppress(grpc.RpcError):
            list(watch(rng.randbytes(50), timeout=5))
        unknown = channel.unary_unary("/rallypoint.rendezvous.v1.Rendezvous/Nope")
        with contextlib.suppress(grpc.RpcError):
            unknown(b"", timeout=5)


def idle_connections(host: str, port: int, count: int = 1000) -> list[socket.socket]:
    """Open ``count`` connections, half of them after a valid preface and SETTINGS; return them open."""
    held = []
    for i in range(count):
        s = socket.create_connection((host, port), timeout=10)
        if i % 2:
            with contextlib.suppress(OSError):
                s.sendall(PREFACE + frame(0x4, 0, 0, b""))
        held.append(s)
    return held


Attack = Callable[[str, int, random.Random], None]
ATTACKS: list[Attack] = [garbage_bytes, truncated_frames, oversized_and_malformed]


def main(argv: list[str] | None = None) -> int:
    """Run every attack in a loop for ``--seconds``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("endpoint")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    host, _, port = args.endpoint.rpartition(":")
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.seconds
    rounds = 0
    while time.monotonic() < deadline:
        for attack in ATTACKS:
            attack(host, int(port), rng)
        rounds += 1
    print(f"{rounds} rounds of {len(ATTACKS)} attacks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
