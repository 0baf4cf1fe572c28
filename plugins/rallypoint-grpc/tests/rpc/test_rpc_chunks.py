"""Large frames between hosts (or without the same-host path) travel in chunks over a streaming call."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc.api import use_agent
from rallypoint_grpc.rpc import transport as rpc_transport
from rallypoint_grpc.rpc.transport import STREAM_METHOD, _chunks

from . import rpc_group as g


@pytest.mark.parametrize("sizes", [[0], [5], [4, 4], [3, 9, 0, 1], [8], [16]])
def test_chunks_cut_the_frame_without_losing_or_adding_bytes(sizes: list[int]) -> None:
    parts = [bytes([i]) * n for i, n in enumerate(sizes)]
    chunks = list(_chunks(parts, 4))
    assert b"".join(chunks) == b"".join(parts)
    assert all(0 < len(c) <= 4 for c in chunks) or chunks == [b""]


def test_frames_larger_than_a_chunk_are_streamed_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    streamed: list[int] = []
    real = rpc_transport.GrpcRpcTransport._stream

    def counted(self: Any, channel: Any, address: str, frame: list[Any], timeout: float | None) -> Any:
        streamed.append(sum(memoryview(p).nbytes for p in frame))
        return real(self, channel, address, frame, timeout)

    monkeypatch.setattr(rpc_transport.GrpcRpcTransport, "_stream", counted)
    # messages of 64 KiB at most: a 1 MiB tensor cannot go in one, and shared memory is off (and
    # the persistent sockets, which carry frames of any size whole)
    options = {"same_host_shm": False, "sockets": False, "max_message_bytes": 64 << 10, "chunk_bytes": 64 << 10}
    with g.rpc_group(2, **options) as agents, use_agent(agents[0]):
        big = torch.rand(1 << 18)
        assert torch.equal(rpc.rpc_sync("w1", g.identity, args=(big,)), big)
        assert torch.equal(rpc.rpc_async("w1", g.identity, args=(big,)).wait(), big)
        assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3  # small frames: one message
        assert len(streamed) == 2
        assert all(n > 1 << 20 for n in streamed)


def test_a_frame_over_max_frame_bytes_is_refused_and_runs_nothing() -> None:
    with g.rpc_group(2, same_host_shm=False, chunk_bytes=64 << 10, max_frame_bytes=256 << 10) as agents:
        with use_agent(agents[0]), pytest.raises(rpc.RpcRefused, match="max_frame_bytes"):
            rpc.rpc_sync("w1", g.add, args=(torch.rand(1 << 18), 1))
        assert g.CALLS == []


def test_the_streaming_method_needs_the_token_too() -> None:
    with g.rpc_group(2) as agents, grpc.insecure_channel(agents[1].info.address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            list(channel.stream_stream(STREAM_METHOD)(iter([b"x"]), timeout=10))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
