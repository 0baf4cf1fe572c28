"""A worker's RPC options come from the job's [rpc] section (RALLYPOINT_CONFIG, as rallypoint run sets it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.core.errors import ConfigError
from rallypoint.rpc import RpcOptions
from rallypoint_grpc.rpc.options import GrpcRpcOptions


def test_options_from_the_variables_the_agent_sets() -> None:
    """``rallypoint run`` hands the resolved ``[rpc]`` to the workers as ``RALLYPOINT_RPC_*`` (TOML values)."""
    env = {
        "RALLYPOINT_RPC_TIMEOUT": '"5s"',
        "RALLYPOINT_RPC_ALLOW": '["torch"]',
        "RALLYPOINT_RPC_OPTIONS": "{ chunk_bytes = 65536 }",
        "RALLYPOINT_RPC_SERIALIZER": "pickle",
        "RALLYPOINT_CONFIG": "/jobs/job.toml",
    }
    opts = RpcOptions.from_environment(env)
    assert (opts.rpc_timeout, tuple(opts.allow), opts.serializer, opts.transport) == (5.0, ("torch",), "pickle", "grpc")
    assert isinstance(opts.transport_options, GrpcRpcOptions)
    assert opts.transport_options.chunk_bytes == 65536
    assert "/jobs/job.toml" in opts.source


def test_defaults_without_any_rpc_variable(tmp_path: Path) -> None:
    assert RpcOptions.from_environment({}).serializer == "safe"
    (tmp_path / "job.toml").write_text('[job]\nentrypoint = "train.py"\n[rpc]\ntimeout = "5s"\n')
    # the job file is the agent's to read: a worker reads only what the agent resolved and handed over
    opts = RpcOptions.from_environment({"RALLYPOINT_CONFIG": str(tmp_path / "job.toml")})
    assert (opts.serializer, opts.rpc_timeout, opts.transport_options) == ("safe", 60.0, None)


def test_invalid_transport_options_name_the_variable_and_key() -> None:
    named = r"RALLYPOINT_RPC_OPTIONS \(environment\): rpc.options: .*mutual_tls needs tls_ca"
    with pytest.raises(ConfigError, match=named):
        RpcOptions.from_environment({"RALLYPOINT_RPC_OPTIONS": "{ mutual_tls = true }"})
