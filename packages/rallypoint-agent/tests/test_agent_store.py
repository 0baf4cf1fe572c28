"""The workers' store served before they start (rallypoint.agent.agent_store, issue #39).

With torch preloaded, a fork of the warm process serves torch's env:// store on the round's port
before any worker starts, and the workers are told to be its clients; a store that cannot be
served falls back to worker rank 0, as without a warm process.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from rallypoint.agent.agent_store import AgentStore, serves_store, wait_listening
from rallypoint.agent.env import WorkerContext, worker_environment
from rallypoint.agent.ranks import DefaultStrategy, RankNode
from rallypoint.agent.warm import WarmLauncher


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def torch_warm() -> Iterator[WarmLauncher]:
    """One warm process that preloads torch, for the module's tests."""
    pytest.importorskip("torch")
    launcher = WarmLauncher(["torch"])
    launcher.wait_ready()
    yield launcher
    launcher.close()


def test_only_a_warm_process_that_imports_torch_serves_the_store() -> None:
    assert serves_store(["torch"])
    assert serves_store(["numpy", "torch.distributed"])
    assert not serves_store([])
    assert not serves_store(["torchvision", "numpy"])


def test_wait_listening_sees_a_listener_and_gives_up_on_a_closed_port_or_when_told() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert wait_listening("127.0.0.1", listener.getsockname()[1], 5.0)
    port = free_port()
    started = time.monotonic()
    assert not wait_listening("127.0.0.1", port, 0.2)
    assert 0.2 <= time.monotonic() - started < 2.0
    started = time.monotonic()
    assert not wait_listening("127.0.0.1", port, 30.0, alive=lambda: False)  # the round is over
    assert time.monotonic() - started < 2.0


def test_the_workers_are_told_whether_an_agent_serves_their_store() -> None:
    ranks = DefaultStrategy().assign([RankNode(node_id="a", group_rank=0, host="h", local_world_size=1)])
    ctx = WorkerContext(ranks.workers[0], "job", 0, 0, 3, "127.0.0.1", 29500, Path("e.json"), "h")
    assert worker_environment(ctx, base={})["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    served = WorkerContext(ranks.workers[0], "job", 0, 0, 3, "127.0.0.1", 29500, Path("e.json"), "h", agent_store=True)
    assert worker_environment(served, base={})["TORCHELASTIC_USE_AGENT_STORE"] == "True"


def test_without_torch_preloaded_no_store_is_served_and_nothing_is_waited_for(tmp_path: Path) -> None:
    said: list[str] = []
    store = AgentStore(WarmLauncher([]), said.append, timeout=30.0)
    started = time.monotonic()
    assert not store.prepare("127.0.0.1", free_port(), serve=False, log=tmp_path / "store.log")
    assert not store.prepare("127.0.0.1", free_port(), serve=True, log=tmp_path / "store.log")
    assert time.monotonic() - started < 1.0
    assert said == []
    assert not (tmp_path / "store.log").exists()


def test_the_store_serves_torch_clients_before_any_worker_and_ends_when_stopped(
    torch_warm: WarmLauncher, tmp_path: Path
) -> None:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    said: list[str] = []
    store = AgentStore(torch_warm, said.append, timeout=30.0)
    port = free_port()
    assert store.prepare("127.0.0.1", port, serve=True, log=tmp_path / "store.log")
    # a client connects at once (no back-off), as a worker with TORCHELASTIC_USE_AGENT_STORE=True does
    started = time.monotonic()
    client = TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10))
    client.set("k", "v")
    assert time.monotonic() - started < 0.5
    assert TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10)).get("k") == b"v"
    # another agent's wait for it ends at once
    other = AgentStore(torch_warm, said.append, timeout=30.0)
    assert other.prepare("127.0.0.1", port, serve=False, log=tmp_path / "other.log")
    store.stop()
    assert not wait_listening("127.0.0.1", port, 0.5)
    assert said == []
    assert (tmp_path / "store.log").read_text() == f"serving torch's env:// store on 127.0.0.1:{port}\n"


def test_a_store_that_cannot_serve_falls_back_to_worker_rank_0_and_says_why(
    torch_warm: WarmLauncher, tmp_path: Path
) -> None:
    said: list[str] = []
    store = AgentStore(torch_warm, said.append, timeout=30.0)
    with socket.socket() as taken:  # the round's port, taken by another program meanwhile
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert not store.prepare("127.0.0.1", port, serve=True, log=tmp_path / "store.log")
    assert len(said) == 1
    assert f"the workers' store process for port {port} ended (exit status 1)" in said[0]
    assert str(tmp_path / "store.log") in said[0]
    assert "Worker rank 0 serves the store instead" in said[0]
    assert "Traceback" in (tmp_path / "store.log").read_text()  # torch's error, kept in the log
