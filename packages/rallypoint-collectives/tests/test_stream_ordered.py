"""The stream-ordered paths of the facade (NCCL's), run on a CPU through a record that says so.

The backend here is Gloo registered with torch under another name by a test plugin whose record
sets ``stream_ordered=True``: the facade must then treat it as it treats NCCL (torch's own
synchronous call without ``timeout=``, polling with one), because of the record's field, not the
backend's name.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from rallypoint.collectives.records import BackendContext, CollectiveBackendRecord
from rallypoint.core.plugins import get_plugin_manager, hookimpl

TORCH_NAME = "rpstream"


def _create_torch_backend(opts: Any, backend_options: Any) -> Any:
    import torch.distributed as dist

    return dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def stream_factory(context: BackendContext) -> None:
    """Register the torch backend once; no pg_options."""
    import torch.distributed as dist

    if not hasattr(dist.Backend, TORCH_NAME.upper()):
        dist.Backend.register_backend(TORCH_NAME, _create_torch_backend, extended_api=True, devices=["cpu"])


class StreamPlugin:
    @hookimpl
    def rallypoint_collective_backends(self) -> list[CollectiveBackendRecord]:
        return [
            CollectiveBackendRecord(
                name="streamy",
                torch_backend=TORCH_NAME,
                device="cpu",
                stream_ordered=True,
                factory=f"{__name__}:stream_factory",
            )
        ]


def _group_timeout() -> float:
    import torch
    import torch.distributed as dist

    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    return float(backend.options._timeout.total_seconds())


@pytest.fixture
def streamy() -> Any:
    import rallypoint.collectives as rc

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    pm = get_plugin_manager(plugins={"streamy": StreamPlugin()})
    info = rc.init("streamy", rank=0, world_size=1, master_addr="127.0.0.1", master_port=port, plugin_manager=pm)
    try:
        yield info
    finally:
        rc.destroy()


def test_stream_ordered_group_uses_torchs_calls_and_polls_with_a_timeout(
    streamy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import torch.distributed as dist

    import rallypoint.collectives as rc
    from rallypoint.collectives import state

    assert streamy.timeout == 600.0
    assert _group_timeout() == 600.0  # the watchdog's timeout is the job default: no margin
    issued: list[bool] = []
    torch_all_reduce = dist.all_reduce

    def spy(tensor: Any, op: Any, group: Any, async_op: bool) -> Any:
        issued.append(async_op)
        return torch_all_reduce(tensor, op, group, async_op)

    monkeypatch.setattr(dist, "all_reduce", spy)
    t = torch.tensor([2.0])
    assert rc.all_reduce(t) is t  # torch's synchronous call, as NCCL's would be
    assert rc.all_reduce(t, timeout=5) is t  # issued asynchronously, then polled
    work = rc.all_reduce(t, async_op=True)
    assert isinstance(work, rc.Work)
    assert work.wait(timeout=5) is True
    assert issued == [False, True, True]
    assert t.item() == 2.0
    info = state.GROUPS[None]
    assert info.stream_ordered
    assert info.seq == 3  # every call is counted, torch's synchronous ones included
    rc.barrier()
    rc.barrier(timeout=5)
    assert info.seq == 5


def test_blocking_group_issues_every_call_asynchronously(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import torch.distributed as dist

    import rallypoint.collectives as rc

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    rc.init("gloo", timeout=20, rank=0, world_size=1, master_addr="127.0.0.1", master_port=port, environ={})
    try:
        assert _group_timeout() == 30.0  # 20 + a margin, so that the facade's timeout fires first
        issued: list[bool] = []
        torch_broadcast = dist.broadcast

        def spy(tensor: Any, src: Any, group: Any, async_op: bool) -> Any:
            issued.append(async_op)
            return torch_broadcast(tensor, src, group, async_op)

        monkeypatch.setattr(dist, "broadcast", spy)
        t = torch.tensor([1.0])
        rc.broadcast(t, 0)
        rc.broadcast(t, 0, timeout=5)
        rc.broadcast(t, 0, async_op=True).wait()
        assert issued == [True, True, True]  # the facade waits with its own timeout
    finally:
        rc.destroy()
