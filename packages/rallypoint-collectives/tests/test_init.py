"""Backend selection, the worker environment, init() in one process, and the error types."""

from __future__ import annotations

import logging
import pickle
import socket
import subprocess
import sys

import pytest

from rallypoint.collectives import BackendUnavailableError, CollectiveTimeout
from rallypoint.collectives.env import WorkerEnv
from rallypoint.collectives.errors import format_ranks
from rallypoint.collectives.records import Availability, CollectiveBackendRecord
from rallypoint.collectives.selection import select_backend
from rallypoint.core.errors import ConfigError, UnknownPluginError
from rallypoint.core.plugins import get_plugin_manager, hookimpl
from rallypoint_nccl.availability import check as nccl_check


def never() -> Availability:
    return Availability(False, "the fabric is down")


class FakePlugin:
    @hookimpl
    def rallypoint_collective_backends(self) -> list[CollectiveBackendRecord]:
        return [
            CollectiveBackendRecord(name="fabric", torch_backend="gloo", availability=f"{__name__}:never", priority=99)
        ]


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, rallypoint.collectives as c; c.CollectiveTimeout; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_auto_picks_nccl_when_usable_else_gloo_and_says_why() -> None:
    selection = select_backend("auto", plugin_manager=get_plugin_manager())
    nccl = nccl_check()
    assert selection.record.name == ("nccl" if nccl.available else "gloo")
    assert selection.reason.startswith("auto: ")
    if not nccl.available:
        assert f"nccl unavailable ({nccl.reason})" in selection.reason


def test_nccl_without_cuda_is_a_clear_error() -> None:
    nccl = nccl_check()
    if nccl.available:
        pytest.skip("CUDA and NCCL are usable here, so NCCL can run")
    with pytest.raises(BackendUnavailableError) as info:
        select_backend("nccl", plugin_manager=get_plugin_manager(), where="RALLYPOINT_COLLECTIVES_BACKEND")
    message = str(info.value)
    assert "'nccl'" in message
    assert "cannot run here" in message
    assert nccl.reason in message
    assert "gloo" in message
    assert "RALLYPOINT_COLLECTIVES_BACKEND" in message


def test_unavailable_third_party_backend_is_skipped_by_auto_and_refused_by_name() -> None:
    pm = get_plugin_manager(plugins={"fake": FakePlugin()})
    selection = select_backend("auto", plugin_manager=pm)
    assert selection.record.name in ("gloo", "nccl")
    assert "fabric unavailable (the fabric is down)" in selection.reason
    with pytest.raises(BackendUnavailableError, match="the fabric is down"):
        select_backend("fabric", plugin_manager=pm)


def test_unknown_backend_names_the_available_ones() -> None:
    with pytest.raises(UnknownPluginError, match="did you mean 'gloo'"):
        select_backend("glo", plugin_manager=get_plugin_manager())


def test_worker_env() -> None:
    env = WorkerEnv.from_environ(
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500",
            "RALLYPOINT_COLLECTIVES_BACKEND": "gloo",
            "RALLYPOINT_COLLECTIVES_TIMEOUT": "2.5",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.master_port) == (3, 4, 1, 29500)
    assert env.backend == "gloo"
    assert env.timeout == 2.5
    assert WorkerEnv.from_environ({"RALLYPOINT_COLLECTIVES_TIMEOUT": "1m"}).timeout == 60.0
    assert WorkerEnv.from_environ({}).backend is None
    with pytest.raises(ConfigError, match="RALLYPOINT_COLLECTIVES_TIMEOUT"):
        WorkerEnv.from_environ({"RALLYPOINT_COLLECTIVES_TIMEOUT": "soon"})
    with pytest.raises(ConfigError, match="RANK"):
        WorkerEnv.from_environ({"RANK": "zero"})


def test_collective_timeout_names_ranks_op_and_group() -> None:
    exc = CollectiveTimeout(
        op="all_reduce", group="WORLD", group_ranks=[0, 1, 2, 3], missing=[3, 2], arrived=[0, 1], rank=0, timeout=5
    )
    assert isinstance(exc, TimeoutError)
    assert exc.missing == (2, 3)
    assert str(exc).startswith("all_reduce on WORLD (ranks 0-3) timed out after 5s on rank 0: ranks 2-3 did not arrive")
    clone = pickle.loads(pickle.dumps(exc))
    assert str(clone) == str(exc)
    assert clone.missing == (2, 3)
    assert format_ranks([5, 0, 1]) == "0-1, 5"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_init_in_one_process_arguments_win_and_it_logs(caplog: pytest.LogCaptureFixture) -> None:
    import torch

    import rallypoint.collectives as rc

    environ = {"RALLYPOINT_COLLECTIVES_BACKEND": "nccl", "RALLYPOINT_COLLECTIVES_TIMEOUT": "99"}
    with caplog.at_level(logging.INFO, logger="rallypoint.collectives"):
        info = rc.init(
            "gloo", timeout="7s", rank=0, world_size=1, master_addr="127.0.0.1", master_port=_port(), environ=environ
        )
    try:
        assert (info.backend, info.rank, info.world_size, info.timeout) == ("gloo", 0, 1, 7.0)
        assert rc.default_timeout() == 7.0
        assert rc.is_initialized()
        assert "uses gloo (gloo as configured" in caplog.text
        t = rc.all_reduce(torch.tensor([2.0]), op=rc.ReduceOp.PRODUCT, timeout=3)
        assert t.item() == 2.0
        assert rc.get_rank() == 0
        assert rc.get_world_size() == 1
        rc.barrier(timeout=5)  # a per-call timeout on a call that completes
        # adopting an existing group keeps it and may change the default timeout
        again = rc.init(timeout=3, environ={})
        assert again.backend == "gloo"
        assert rc.default_timeout() == 3.0
    finally:
        rc.destroy()
    assert not rc.is_initialized()


def test_init_without_rank_says_what_to_set() -> None:
    import rallypoint.collectives as rc

    with pytest.raises(ConfigError, match="RANK"):
        rc.init("gloo", environ={})


class StreamPlugin:
    @hookimpl
    def rallypoint_collective_backends(self) -> list[CollectiveBackendRecord]:
        return [CollectiveBackendRecord(name="streamy", torch_backend="streamy", device="cuda", stream_ordered=True)]


def test_a_groups_kind_comes_from_its_backend_record() -> None:
    from rallypoint.collectives import state
    from rallypoint.collectives.selection import backends_by_torch_name

    state.use_backends(backends_by_torch_name(get_plugin_manager(plugins={"streamy": StreamPlugin()})))
    try:
        assert state.is_stream_ordered("nccl")
        assert not state.is_stream_ordered("gloo")
        assert state.is_stream_ordered("cpu:gloo,cuda:nccl")  # one backend per device
        assert state.is_stream_ordered("streamy")  # a third party's, by its record, not its name
        assert not state.is_stream_ordered("mpi")  # unregistered: timed as a blocking backend
        assert [r.name for r in state.backend_records("cpu:gloo,cuda:streamy")] == ["gloo", "streamy"]
    finally:
        state.use_backends(backends_by_torch_name(get_plugin_manager()))
