"""The third-party strategy of docs/ranks.md, installed as a throwaway distribution and selected by name;
and ``rallypoint plugins list`` showing the bundled strategies."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent.ranks import RankAssignmentError, RankNode, compute_assignment
from rallypoint.agent.records import RANK_STRATEGIES
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import get_plugin_manager

DOCS = Path(__file__).resolve().parents[3] / "docs" / "ranks.md"
BLOCK_RE = re.compile(r'^```(\w+) title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)
CLI = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]


def docs_files() -> dict[str, str]:
    """The titled code blocks of the worked example: file name -> text."""
    assert DOCS.is_file(), f"{DOCS} is missing: this test runs the worked example of the docs"
    return {title: text for _, title, text in BLOCK_RE.findall(DOCS.read_text(encoding="utf-8"))}


@pytest.fixture
def hostfile_site(tmp_path: Path) -> Iterator[Path]:
    """Install rallypoint-hostfile from the docs into a fresh site directory (module + .dist-info)."""
    files = docs_files()
    project = tomllib.loads(files.pop("pyproject.toml"))["project"]
    site = tmp_path / "site"
    package = site / "rallypoint_hostfile"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""rallypoint-hostfile."""\n')
    for title, text in files.items():
        assert title.startswith("rallypoint_hostfile/"), title
        (site / title).write_text(text)
    info = site / f"rallypoint_hostfile-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    entry_points = project["entry-points"]["rallypoint"]
    (info / "entry_points.txt").write_text(
        "[rallypoint]\n" + "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    )
    yield site
    for name in [m for m in sys.modules if m == "rallypoint_hostfile" or m.startswith("rallypoint_hostfile.")]:
        del sys.modules[name]


def test_docs_example_is_selected_by_name(
    hostfile_site: Path, monkeypatch: pytest.MonkeyPatch, resolve_options: Any
) -> None:
    monkeypatch.syspath_prepend(str(hostfile_site))
    monkeypatch.delenv("RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("RALLYPOINT_DISABLE_PLUGINS", raising=False)
    pm = get_plugin_manager()
    assert pm.infos["hostfile"].distribution == "rallypoint-hostfile"
    registry = pm.registry(RANK_STRATEGIES)
    assert {"default", "topology", "explicit", "env", "hostfile"} <= set(registry.names())
    record = registry.get("hostfile")
    nodes = [
        RankNode(node_id="a", group_rank=0, host="node66", local_world_size=2, role="trainer"),
        RankNode(node_id="b", group_rank=1, host="node7", local_world_size=1, role="eval"),
        RankNode(node_id="c", group_rank=2, host="node8", local_world_size=2, role="trainer"),
    ]
    options = resolve_options("hostfile", {"hosts": ["node7", "node8", "node66"]}, pm)
    assert type(options).__name__ == "HostfileOptions"
    assignment = compute_assignment(record, nodes, options)
    assert [(w.node_id, w.rank, w.role_rank) for w in assignment] == [
        ("b", 0, 0),
        ("c", 1, 0),
        ("c", 2, 1),
        ("a", 3, 2),
        ("a", 4, 3),
    ]
    assert compute_assignment(record, list(reversed(nodes)), options) == assignment
    with pytest.raises(RankAssignmentError, match="rank strategy 'hostfile' failed: host 'node8' is not in"):
        compute_assignment(record, nodes, resolve_options("hostfile", {"hosts": ["node7", "node66"]}, pm))
    with pytest.raises(ConfigError) as info:
        resolve_options("hostfile", {"host": ["node7"]}, pm)
    assert [issue.key for issue in info.value.issues] == ["ranks.options.hosts", "ranks.options.host"]


def run_cli(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_plugins_list_shows_the_strategies(hostfile_site: Path) -> None:
    result = run_cli("plugins", "list", "--json", pythonpath=hostfile_site)
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    assert plugins["ranks"]["distribution"] == "rallypoint-ranks"
    assert list(plugins["ranks"]["registers"].values()) == [["topology", "explicit", "env"]]
    assert list(plugins["hostfile"]["registers"].values()) == [["hostfile"]]
    text = run_cli("plugins", "list", pythonpath=hostfile_site)
    assert re.search(r"^ranks +rallypoint-ranks \S+ +rank strategy: topology, explicit, env$", text.stdout, re.M)
    assert re.search(r"^hostfile +rallypoint-hostfile 0\.1\.0 +rank strategy: hostfile$", text.stdout, re.M)


def test_config_check_validates_strategy_options(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        '[job]\nentrypoint = "train.py"\n[ranks]\nstrategy = "explicit"\n[ranks.options.hosts]\nnode7 = [0, 0]\n'
    )
    result = run_cli("config", "check", str(job))
    assert result.returncode == 2
    assert "ranks.options" in result.stderr
    assert "global rank 0 appears twice in entry 'node7'" in result.stderr
