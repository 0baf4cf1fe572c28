"""The monorepo installed as a whole: every framework package registers through its essential entry point.

Core's own tests use a made-up subsystem; these check the real one: ``rallypoint plugins list``,
``--version`` and ``config check`` with every package and plugin of the workspace installed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]
ESSENTIAL = ["core", "agent", "collectives", "rendezvous", "rpc", "timer"]
PLUGINS = ["etcd", "file", "gloo", "grpc", "nccl", "ranks"]

FULL_JOB = """\
[job]
name = "mnist"
entrypoint = "train.py"
args = ["--epochs", "3"]

[nodes]
min = 2
max = 4
nproc_per_node = 2

[rendezvous]
backend = "file"
run_id = "mnist-42"
join_timeout = "10m"
[rendezvous.options]
path = "/tmp/rdzv"

[ranks]
strategy = "topology"

[collectives]
backend = "gloo"
timeout = "60s"

[agent]
max_restarts = 3
tee = [0, 3]

[timer]
watchdog = "file"
timeline = true
"""


def _version(dist: str) -> str:
    return importlib.metadata.version(dist)


def run_cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_") and k != "PYTHONPATH"}
    environ.update(env or {})
    return subprocess.run([*CLI, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=60, check=False)


def _rows(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.splitlines()[1:]:
        if not line or line.startswith(" ") or line.startswith("*"):
            continue
        if line.startswith("failed to load") or line.startswith("disabled by"):
            break
        rows[line.split()[0]] = line
    return rows


def test_every_framework_package_advertises_an_essential_entry_point() -> None:
    for name in ESSENTIAL[1:]:
        project = tomllib.loads((ROOT / "packages" / f"rallypoint-{name}" / "pyproject.toml").read_text())["project"]
        assert project["entry-points"]["rallypoint.essential"] == {name: f"rallypoint.{name}.plugin"}
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="rallypoint.essential")}
    assert installed == {name: f"rallypoint.{name}.plugin" for name in ESSENTIAL[1:]}


def test_plugins_list_shows_the_essential_packages_and_the_monorepo_plugins() -> None:
    result = run_cli("plugins", "list")

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    rows = _rows(result.stdout)
    assert list(rows) == ESSENTIAL + PLUGINS
    for name in ESSENTIAL:
        assert rows[name].split()[:4] == [name, "*", f"rallypoint-{name}", _version(f"rallypoint-{name}")]
    for name in PLUGINS:
        assert rows[name].split()[:3] == [name, f"rallypoint-{name}", _version(f"rallypoint-{name}")]
    assert rows["core"].endswith("CLI command: plugins, config, plugin")
    assert rows["gloo"].endswith("collective backend: gloo")
    assert rows["rendezvous"].endswith("rendezvous backend: memory")
    lines = result.stdout.splitlines()
    assert "declares sections: [job], [nodes], [ranks], [agent], [launch], [debug]" in [line.strip() for line in lines]
    assert "launch environment: slurm, kubernetes, none" in [line.strip() for line in lines]
    assert rows["rpc"].endswith("declares kinds: RPC transport")  # it registers nothing itself
    assert "* essential package (loaded even when RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD is set)" in lines
    assert "failed to load" not in result.stdout


def test_plugins_list_json_marks_the_essential_packages() -> None:
    result = run_cli("plugins", "list", "--json")

    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["failed"] == []
    plugins = {p["name"]: p for p in data["plugins"]}
    assert [n for n, p in plugins.items() if p["essential"]] == ESSENTIAL
    assert plugins["collectives"]["declares"] == {"kinds": ["collective backend"], "sections": ["collectives"]}
    assert plugins["gloo"]["registers"] == {"collective backend": ["gloo"]}


def test_version_lists_every_rallypoint_distribution_and_plugin() -> None:
    result = run_cli("--version")

    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        f"rallypoint {_version('rallypoint-core')}",
        *(f"  rallypoint-{name} {_version(f'rallypoint-{name}')}" for name in ESSENTIAL),
        *(f"  rallypoint-{name} {_version(f'rallypoint-{name}')}" for name in PLUGINS),
        "plugins:",
        *(f"  {name} (rallypoint-{name} {_version(f'rallypoint-{name}')})" for name in PLUGINS),
    ]


def test_autoload_off_keeps_the_essential_packages() -> None:
    result = run_cli("plugins", "list", "--json", env={"RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": "1"})

    assert result.returncode == 0
    assert [p["name"] for p in json.loads(result.stdout)["plugins"]] == ESSENTIAL


def test_disabling_an_essential_package_sets_its_plugins_aside() -> None:
    result = run_cli("plugins", "list", env={"RALLYPOINT_DISABLE_PLUGINS": "collectives"})

    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert "collectives" not in rows
    assert "gloo" not in rows
    assert "file" in rows
    assert "\nfailed to load:\n  plugin 'gloo' (rallypoint-gloo " in result.stdout
    assert (
        "it implements rallypoint_collective_backends, a hook that no installed package declares "
        "(essential packages disabled or not loaded: collectives)"
    ) in result.stdout
    assert result.stderr.count("warning: plugin ") == 2


def test_config_check_of_a_whole_job(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(FULL_JOB)

    result = run_cli("config", "check", "job.toml", "--json", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # sections in declaration order (essential packages load by name); [rpc] is optional and absent
    agent_sections = ["job", "nodes", "ranks", "agent", "launch", "debug"]
    assert list(data) == [*agent_sections, "collectives", "rendezvous", "timer", "plugins"]
    assert data["job"] == {"name": "mnist", "entrypoint": "train.py", "args": ["--epochs", "3"], "env": {}}
    assert data["rendezvous"]["join_timeout"] == "10m"
    assert data["rendezvous"]["options"]["path"] == "/tmp/rdzv"
    assert data["plugins"]["collectives.backend"]["provider"] == f"gloo (rallypoint-gloo {_version('rallypoint-gloo')})"
    assert data["plugins"]["timer.watchdog"]["provider"] == f"timer (rallypoint-timer {_version('rallypoint-timer')})"
    assert "rpc.transport" not in data["plugins"]


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            '[rendezvous]\nbackend = "fiel"\n',
            "error: job.toml: rendezvous.backend: unknown rendezvous backend 'fiel'; available: etcd, file, grpc, "
            "memory; did you mean 'file'? Install plugins with pip install rallypoint-<name>; "
            "see rallypoint plugins list",
        ),
        (
            "[jobs]\nentrypoint = 'train.py'\n",
            "error: job.toml: jobs: unknown section [jobs]; did you mean [job]? (known sections: agent, "
            "collectives, debug, job, launch, nodes, ranks, rendezvous, rpc, timer). Sections are declared by "
            "installed packages: "
            "if [jobs] belongs to one that is missing or disabled, install or enable it (see rallypoint plugins list)",
        ),
    ],
)
def test_config_check_errors_name_the_file_and_key(tmp_path: Path, toml: str, message: str) -> None:
    (tmp_path / "job.toml").write_text(toml)

    result = run_cli("config", "check", "job.toml", cwd=tmp_path)

    assert result.returncode == 2
    assert result.stderr.splitlines() == [message]
