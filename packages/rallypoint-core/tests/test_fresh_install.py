"""``rallypoint-core`` alone, in a fresh virtual environment: core works, and its own test suite passes.

The environment gets core's declared dependencies and pytest from the package index, then core
itself with ``--no-deps``: no other rallypoint distribution is present, so nothing core does (or
tests) can lean on one.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

#: packages/rallypoint-core, found from this file (tests/ is inside it).
PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: The workspace root: its pyproject.toml holds the pytest configuration the suite runs with.
ROOT = PACKAGE_DIR.parents[1]
#: What the suite needs besides core's own dependencies (the root configuration uses --timeout).
TEST_TOOLS = ["pytest>=8", "pytest-timeout>=2.3"]


def _run(args: list[str | Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # the environment of the tests, minus anything that would leak the workspace into the new venv
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RALLYPOINT_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding rallypoint-core, its dependencies and pytest; returns its bin directory."""
    where = tmp_path_factory.mktemp("core-alone")
    venv = where / "venv"
    created = _run([sys.executable, "-m", "venv", venv], cwd=where)
    assert created.returncode == 0, created.stderr
    python = venv / "bin" / "python"
    dependencies = tomllib.loads((PACKAGE_DIR / "pyproject.toml").read_text())["project"]["dependencies"]
    deps = _run([python, "-m", "pip", "install", "-q", *dependencies, *TEST_TOOLS], cwd=where, timeout=600)
    assert deps.returncode == 0, "installing core's dependencies failed:\n" + deps.stdout + deps.stderr
    core = _run([python, "-m", "pip", "install", "-q", "--no-deps", PACKAGE_DIR], cwd=where, timeout=600)
    assert core.returncode == 0, "installing rallypoint-core failed:\n" + core.stdout + core.stderr
    return venv / "bin"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_venv_holds_core_and_no_other_rallypoint_distribution(core_venv: Path, tmp_path: Path) -> None:
    listed = _run([core_venv / "python", "-m", "pip", "list", "--format=json"], cwd=tmp_path)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}

    assert {n for n in names if n.startswith("rallypoint")} == {"rallypoint-core"}
    assert {"pluggy", "pydantic", "click"} <= names

    plugins = _run([core_venv / "rallypoint", "plugins", "list"], cwd=tmp_path)
    assert plugins.returncode == 0, plugins.stderr
    assert plugins.stderr == ""
    lines = plugins.stdout.splitlines()
    version = importlib.metadata.version("rallypoint-core")  # the workspace's, built from the same source
    assert lines[1].split() == [
        "core",
        "*",
        "rallypoint-core",
        version,
        "CLI",
        "command:",
        "plugins,",
        "config,",
        "plugin",
    ]
    assert lines[2].split() == ["declares", "kinds:", "CLI", "command"]
    assert lines[3:] == ["", "* essential package (loaded even when RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD is set)"]

    # with no section declared, a job file can only be empty; any section says a package may be missing
    (tmp_path / "empty.toml").write_text("")
    checked = _run([core_venv / "rallypoint", "config", "check", "empty.toml"], cwd=tmp_path)
    assert (checked.returncode, checked.stderr) == (0, "\nempty.toml: ok\n")
    (tmp_path / "job.toml").write_text("[nodes]\nmin = 2\n")
    refused = _run([core_venv / "rallypoint", "config", "check", "job.toml"], cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: job.toml: nodes: unknown section [nodes] (known sections: none). ")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cores_own_test_suite_passes_with_core_alone(core_venv: Path) -> None:
    result = _run(
        [core_venv / "python", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "not slow", PACKAGE_DIR / "tests"],
        cwd=ROOT,
        timeout=800,
    )

    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert re.search(r"\d+ passed", summary), summary
    assert not re.search(r"failed|error|skipped", summary), summary
