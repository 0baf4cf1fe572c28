"""``[rpc]`` settings reach the workers from every source: job file, ``--set``, ``RALLYPOINT_RPC_*``.

The agent resolves the job once; each worker's ``rpc.init_rpc`` reads the options it was given
(``RpcOptions.from_environment``), never a job file of its own, so a value given on the command
line or in the agent's environment is the value the workers use, with or without a job file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent.plan import NodeFacts, plan_job
from rallypoint.core.config import load_job_config, resolve_config
from rallypoint.core.plugins import get_plugin_manager
from rallypoint.rpc.options import RpcOptions

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

SHOW_OPTIONS = """
import json, os, sys
from rallypoint.rpc.options import RpcOptions
o = RpcOptions.from_environment()
opts = o.transport_options
opts = opts.model_dump(mode="json") if hasattr(opts, "model_dump") else opts
out = {"timeout": o.rpc_timeout, "allow": list(o.allow), "serializer": o.serializer,
       "threads": o.num_worker_threads, "transport": o.transport, "options": opts}
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(out, f)
"""


def _worker_options(tmp_path: Path, text: str | None, environ: dict[str, str], *sets: tuple[str, Any]) -> RpcOptions:
    pm = get_plugin_manager(environ=environ)
    path = None
    if text is not None:
        path = tmp_path / "job.toml"
        path.write_text(text)
    flags = [(key, value, "--set (command line)") for key, value in sets]
    resolved = resolve_config(load_job_config(path, pm, environ=environ, overrides=flags), pm)
    (tmp_path / "train.py").write_text("pass\n")
    facts = NodeFacts(host="node-a", pid=1, environ=environ, cwd=tmp_path, job_file=path, script_from_cli=path is None)
    env = plan_job(resolved, facts).settings.worker_env
    return RpcOptions.from_environment({**environ, **env})


def test_set_on_the_command_line_without_a_job_file(tmp_path: Path) -> None:
    options = _worker_options(
        tmp_path,
        None,
        {},
        ("job.entrypoint", "train.py"),
        ("rpc.timeout", "2s"),
        ("rpc.allow", ["mymod", "other.*"]),
        ("rpc.serializer", "pickle"),
        ("rpc.num_worker_threads", 3),
    )
    assert options.rpc_timeout == 2.0
    assert list(options.allow) == ["mymod", "other.*"]
    assert (options.serializer, options.num_worker_threads) == ("pickle", 3)


def test_set_on_the_command_line_wins_over_the_job_file(tmp_path: Path) -> None:
    job = '[job]\nentrypoint = "train.py"\n[rpc]\ntimeout = "30s"\nallow = ["fromfile"]\n'
    options = _worker_options(tmp_path, job, {}, ("rpc.timeout", "2s"))
    assert options.rpc_timeout == 2.0
    assert list(options.allow) == ["fromfile"]


def test_the_agents_environment_without_a_job_file(tmp_path: Path) -> None:
    environ = {"RALLYPOINT_RPC_TIMEOUT": "7s", "RALLYPOINT_RPC_ALLOW": '["envmod"]'}
    options = _worker_options(tmp_path, None, environ, ("job.entrypoint", "train.py"))
    assert options.rpc_timeout == 7.0
    assert list(options.allow) == ["envmod"]


def test_transport_options_from_the_job_file_arrive_validated(tmp_path: Path) -> None:
    job = '[job]\nentrypoint = "train.py"\n[rpc]\n[rpc.options]\nmax_message_bytes = 65536\n'
    options = _worker_options(tmp_path, job, {})
    assert options.transport == "grpc"
    assert options.transport_options.max_message_bytes == 65536  # the transport's model, as resolution made it


def test_a_job_without_rpc_gives_the_defaults(tmp_path: Path) -> None:
    options = _worker_options(tmp_path, '[job]\nentrypoint = "train.py"\n', {})
    assert (options.rpc_timeout, tuple(options.allow), options.serializer) == (60.0, (), "safe")


@pytest.mark.slow
def test_rallypoint_run_hands_set_values_to_the_workers(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW_OPTIONS)
    cmd = [
        *RALLYPOINT,
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
        "--set",
        "rpc.timeout=2s",
        "--set",
        'rpc.allow=["mymod"]',
        str(script),
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["timeout"] == 2.0
        assert seen["allow"] == ["mymod"]
