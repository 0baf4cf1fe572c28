"""The optional ``[rpc]`` section and the RPC-transport kind this package declares (moved from core)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.core.config import build_schema, load_job_config, resolve_config
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import get_plugin_manager
from rallypoint.rpc.config import RPC_SECTION, RpcSection
from rallypoint.rpc.records import RPC_TRANSPORTS

SCHEMA = build_schema([RPC_SECTION])


def test_the_package_declares_its_kind_and_an_optional_section() -> None:
    pm = get_plugin_manager(autoload=False)

    assert pm.kind("rallypoint_rpc_transports") is RPC_TRANSPORTS
    assert RPC_TRANSPORTS.config_key == "rpc.transport"
    assert RPC_SECTION in pm.sections()
    assert RPC_SECTION.optional is True
    assert pm.infos["rpc"].essential is True


def test_the_section_is_absent_unless_the_job_has_it(tmp_path: Path) -> None:
    loaded = load_job_config(None, SCHEMA, environ={})
    assert loaded.config.rpc is None
    assert loaded.section_or_none(RpcSection) is None

    (tmp_path / "job.toml").write_text('[rpc]\ntransport = "grpc"\nserializer = "pickle"\n')
    rpc = load_job_config(tmp_path / "job.toml", SCHEMA, environ={}).section(RpcSection)
    assert (rpc.transport, rpc.serializer, rpc.options) == ("grpc", "pickle", {})


def test_serializer_is_safe_or_pickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.toml").write_text('[rpc]\nserializer = "json"\n')

    with pytest.raises(ConfigError) as info:
        load_job_config("job.toml", SCHEMA, environ={})

    assert str(info.value) == "job.toml: rpc.serializer: expected 'safe' or 'pickle', got 'json'"


@pytest.mark.parametrize("pattern", ["", "*", "my pkg", "pkg.", "pkg.*.x", ".*"])
def test_allow_holds_module_patterns_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pattern: str) -> None:
    # such a pattern matched nothing, silently: a worker then refused every call the user meant to allow
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.toml").write_text(f'[rpc]\nallow = ["mypkg", "mypkg.*", "{pattern}"]\n')

    with pytest.raises(ConfigError) as info:
        load_job_config("job.toml", SCHEMA, environ={})

    assert str(info.value) == (
        f'job.toml: rpc.allow[2]: {pattern!r} is not a module pattern: write a module ("mypkg": it and its '
        'submodules) or "mypkg.*" (its submodules)'
    )


def test_init_rpc_options_refuse_a_pattern_too() -> None:
    from rallypoint.rpc.errors import RpcError
    from rallypoint.rpc.exposure import Exposure

    assert Exposure(["mypkg", "a.b.*"]).allowed_module("a.b.c")
    with pytest.raises(RpcError, match="invalid \\[rpc\\] allow: '' is not a module pattern"):
        Exposure([""])


def test_the_transport_is_resolved_only_when_the_job_has_an_rpc_section(tmp_path: Path) -> None:
    pm = get_plugin_manager(environ={}, disabled=["grpc"])  # the transport plugin is disabled
    assert pm.registry(RPC_TRANSPORTS).names() == []
    entry = [("job.entrypoint", "train.py", "test")]
    assert resolve_config(load_job_config(None, pm, environ={}, overrides=entry), pm).selection("rpc.transport") is None

    (tmp_path / "rpc.toml").write_text('[job]\nentrypoint = "train.py"\n[rpc]\n')
    with pytest.raises(ConfigError) as info:
        resolve_config(load_job_config(tmp_path / "rpc.toml", pm, environ={}), pm)
    # The disabled transport plugin is named as disabled (not as missing), with the way back.
    assert (
        f"{tmp_path / 'rpc.toml'}: rpc.transport: 'grpc' is provided by the plugin 'grpc', which is disabled by"
        " RALLYPOINT_DISABLE_PLUGINS; remove grpc from that variable to use it"
    ) in str(info.value)


def test_mode_is_rallypoint_or_torch_and_reaches_the_worker_s_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rallypoint.rpc.options import RpcOptions

    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.toml").write_text('[rpc]\nmode = "pytorch"\n')
    with pytest.raises(ConfigError) as info:
        load_job_config("job.toml", SCHEMA, environ={})
    assert str(info.value) == "job.toml: rpc.mode: expected 'rallypoint' or 'torch', got 'pytorch'"

    assert RpcOptions.from_environment({}).mode == "rallypoint"
    # what the launcher sets from the resolved [rpc] section (any source), or a user running by hand
    assert RpcOptions.from_environment({"RALLYPOINT_RPC_MODE": "torch"}).mode == "torch"
