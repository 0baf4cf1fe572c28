"""A worker's RPC options come from the job's [rpc] section (RALLYPOINT_CONFIG, as rallypoint run sets it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.core.errors import ConfigError
from rallypoint.rpc import RpcOptions
from rallypoint_grpc.rpc_options import GrpcRpcOptions


def test_options_from_the_job_file_and_its_variables(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    job = tmp_path / "job.toml"
    job.write_text(
        '[job]\nentrypoint = "train.py"\n[rpc]\ntimeout = "5s"\nallow = ["torch"]\n[rpc.options]\nchunk_bytes = 65536\n'
    )
    opts = RpcOptions.from_environment({"RALLYPOINT_CONFIG": str(job), "RALLYPOINT_RPC_SERIALIZER": "pickle"})
    assert (opts.rpc_timeout, tuple(opts.allow), opts.serializer, opts.transport) == (5.0, ("torch",), "pickle", "grpc")
    assert isinstance(opts.transport_options, GrpcRpcOptions)
    assert opts.transport_options.chunk_bytes == 65536
    assert str(job) in opts.source


def test_defaults_without_a_job_file_or_without_an_rpc_section(tmp_path: Path) -> None:
    assert RpcOptions.from_environment({}).serializer == "safe"
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.toml").write_text('[job]\nentrypoint = "train.py"\n')
    opts = RpcOptions.from_environment({"RALLYPOINT_CONFIG": str(tmp_path / "job.toml")})
    assert (opts.serializer, opts.rpc_timeout, opts.transport_options) == ("safe", 60.0, None)


def test_invalid_transport_options_name_the_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.toml").write_text('[job]\nentrypoint = "train.py"\n[rpc.options]\nmutual_tls = true\n')
    with pytest.raises(ConfigError, match=r"job.toml: rpc.options: .*mutual_tls needs tls_ca"):
        RpcOptions.from_environment({"RALLYPOINT_CONFIG": str(tmp_path / "job.toml")})
