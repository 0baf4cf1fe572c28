"""The same-host fast path of the grpc RPC transport: large frames through /dev/shm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc.api import use_agent
from rallypoint.rpc.wire import pack_parts
from rallypoint_grpc.rpc.shared_memory import REF_MAGIC, THRESHOLD, SharedMemoryPath
from rallypoint_grpc.rpc.transport import METHOD

from . import rpc_group as g

SHM = Path("/dev/shm")


@pytest.fixture(autouse=True)
def _shm_exists() -> None:
    # the same-host path needs /dev/shm; a Linux CI machine without it is broken, not a reason to skip
    assert SHM.is_dir(), "/dev/shm is missing: the same-host RPC path cannot be tested here"


def _frames() -> set[str]:
    return {p.name for p in SHM.glob("rallypoint-rpc-*") if not p.name.endswith(".marker")}


class Counting:
    def __init__(self, shm: SharedMemoryPath) -> None:
        self.puts = 0
        put = shm.put

        def counted(frame: list[Any]) -> tuple[bytes, str]:
            self.puts += 1
            return put(frame)

        shm.put = counted  # type: ignore[method-assign]


def test_large_frames_between_workers_of_one_host_go_through_shared_memory() -> None:
    before = _frames()
    # on the gRPC path (with sockets, calls on one host take a Unix socket: test_rpc_sockets.py)
    with g.rpc_group(2, sockets=False) as agents, use_agent(agents[0]):
        client, server = Counting(agents[0].transport.shm), Counting(agents[1].transport.shm)  # type: ignore[attr-defined]
        big = torch.rand(1 << 18)  # 1 MiB
        assert torch.equal(rpc.rpc_sync("w1", g.identity, args=(big,)), big)  # learns that w1 is local
        assert server.puts == 1  # the reply went through shared memory already
        assert torch.equal(rpc.rpc_sync("w1", g.identity, args=(big,)), big)
        assert torch.equal(rpc.rpc_async("w1", g.identity, args=(big,)).wait(), big)
        assert (client.puts, server.puts) == (2, 3)
        assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3  # small frames stay in the gRPC message
        assert (client.puts, server.puts) == (2, 3)
        assert _frames() == before  # every frame file was taken and removed
        markers = [agents[i].transport.shm.marker for i in range(2)]  # type: ignore[attr-defined]
        assert all((SHM / m).exists() for m in markers)
    assert not any((SHM / m).exists() for m in markers)


def test_the_fast_path_can_be_turned_off() -> None:
    with g.rpc_group(2, same_host_shm=False) as agents, use_agent(agents[0]):
        assert agents[0].transport.shm is None  # type: ignore[attr-defined]
        big = torch.rand(1 << 18)
        assert torch.equal(rpc.rpc_sync("w1", g.identity, args=(big,)), big)


@pytest.mark.parametrize(
    "name",
    [
        "../../etc/passwd",
        "rallypoint-rpc-" + "0" * 32 + "-p1.marker",
        "rallypoint-rpc-" + "0" * 32,
        "x" * 5000,
        "\x00",
    ],
)
def test_forged_shared_memory_references_are_refused(name: str) -> None:
    with g.rpc_group(2) as agents:
        with grpc.insecure_channel(agents[1].info.address) as channel, pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(METHOD)(
                REF_MAGIC + name.encode(), timeout=10, metadata=(("authorization", f"Bearer {g.TOKEN}"),)
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with use_agent(agents[0]):
            assert rpc.rpc_sync("w1", g.add, args=(1, 2)) == 3
    assert g.CALLS == ["add"]


def test_a_reference_to_a_file_that_is_not_a_regular_file_of_this_user_is_refused(tmp_path: Path) -> None:
    shm = SharedMemoryPath.create(1 << 20, tmp_path)
    assert shm is not None
    message, name = shm.put(pack_parts(b"{}", [b"x" * THRESHOLD]))
    frame = shm.take(message)
    assert not frame.readonly  # mapped in place, writable (private)
    assert bytes(frame[-THRESHOLD:]) == b"x" * THRESHOLD
    assert not (tmp_path / name).exists()
    message, name = shm.put([b"y" * THRESHOLD])
    (tmp_path / name).unlink()
    (tmp_path / name).symlink_to("/etc/hostname")
    with pytest.raises(ValueError, match="cannot be opened"):
        shm.take(message)
    big, big_name = shm.put([b"x" * ((1 << 20) + 1)])
    with pytest.raises(ValueError, match="size limit"):
        shm.take(big)
    assert not (tmp_path / big_name).exists()  # removed even when refused
    assert not shm.visible("rallypoint-rpc-" + "1" * 32 + "-p1.marker")
    assert shm.visible(shm.marker)
    shm.close()
    assert not (tmp_path / shm.marker).exists()


def test_markers_of_processes_that_are_gone_are_swept(tmp_path: Path) -> None:
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"rallypoint-rpc-{'2' * 32}-p{int(dead.stdout)}.marker"
    alive = tmp_path / f"rallypoint-rpc-{'3' * 32}-p1.marker"  # pid 1 is alive
    stale.write_text("")
    alive.write_text("")
    shm = SharedMemoryPath.create(1 << 20, tmp_path)
    assert shm is not None
    assert not stale.exists()
    assert alive.exists()
    shm.close()
