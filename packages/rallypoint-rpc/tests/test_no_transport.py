"""rallypoint-rpc without a transport plugin: init_rpc and the job file say exactly what to install.

The workspace has every package installed; these tests hide the entry points of
``rallypoint-grpc`` (the distribution that provides the ``grpc`` transport), which is what an
environment holding ``pip install rallypoint-rpc`` alone looks like to the plugin manager.
"""

from __future__ import annotations

import importlib.metadata
import socket
from pathlib import Path
from typing import Any

import pytest

from rallypoint import rpc
from rallypoint.core.config import load_job_config, resolve_config
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import get_plugin_manager

INSTALL = "pip install rallypoint-grpc (the grpc transport), or pip install rallypoint (batteries included)"


@pytest.fixture
def without_grpc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry points of every distribution but rallypoint-grpc."""
    real = importlib.metadata.entry_points

    def entry_points(**params: Any) -> Any:
        found = real(**params)
        if "group" not in params:
            return found
        return importlib.metadata.EntryPoints(
            ep for ep in found if ep.dist is None or ep.dist.name.replace("_", "-") != "rallypoint-grpc"
        )

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.delenv("RALLYPOINT_DISABLE_PLUGINS", raising=False)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _options() -> rpc.RpcOptions:
    # a store nobody serves: the transport must be looked up before any wait for it
    return rpc.RpcOptions(init_method=f"tcp://127.0.0.1:{_unused_port()}", init_timeout=2)


@pytest.mark.usefixtures("without_grpc")
def test_init_rpc_without_a_transport_says_what_to_install() -> None:
    with pytest.raises(rpc.RpcError) as info:
        rpc.init_rpc("worker1", rank=1, world_size=2, options=_options())

    assert str(info.value) == (
        "init_rpc: the RPC transport 'grpc' (init_rpc options) is not installed, and rallypoint-rpc makes no "
        f"calls without one: {INSTALL}"
    )


def test_init_rpc_with_the_transport_plugin_disabled_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RALLYPOINT_DISABLE_PLUGINS", "grpc")

    with pytest.raises(rpc.RpcError) as info:
        rpc.init_rpc("worker1", rank=1, world_size=2, options=_options())

    assert str(info.value) == (
        "init_rpc: 'grpc' is provided by the plugin 'grpc', which is disabled by RALLYPOINT_DISABLE_PLUGINS; "
        "remove grpc from that variable to use it"
    )


@pytest.mark.usefixtures("without_grpc")
def test_a_job_file_with_rpc_and_no_transport_says_what_to_install(tmp_path: Path) -> None:
    pm = get_plugin_manager(environ={})
    (tmp_path / "rpc.toml").write_text('[job]\nentrypoint = "train.py"\n[rpc]\n')

    with pytest.raises(ConfigError) as info:
        resolve_config(load_job_config(tmp_path / "rpc.toml", pm, environ={}), pm)

    assert str(info.value) == (
        f"{tmp_path / 'rpc.toml'}: rpc.transport: RPC transport 'grpc' is not installed, and no RPC transport is; "
        + INSTALL
    )
