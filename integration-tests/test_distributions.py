"""Every distribution of the monorepo builds on its own and declares what it imports.

These checks guard the promise that each package is separately pip-installable: a wheel and an
sdist build with hatchling, the shared ``rallypoint`` namespace stays PEP 420 (no
``rallypoint/__init__.py`` in any wheel), plugins advertise their entry point, and every
import of another rallypoint distribution is a declared dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = sorted(
    p.parent for p in [*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("plugins/*/pyproject.toml")]
)
FRAMEWORK = ["core", "rendezvous", "agent", "timer", "collectives", "rpc"]
PLUGINS = ["file", "grpc", "etcd", "gloo", "nccl", "ranks"]


def _project(dist_dir: Path) -> dict:
    return tomllib.loads((dist_dir / "pyproject.toml").read_text())["project"]


def test_the_monorepo_has_every_distribution() -> None:
    names = {_project(d)["name"] for d in DISTRIBUTIONS}
    expected = {"rallypoint"} | {f"rallypoint-{n}" for n in FRAMEWORK + PLUGINS}
    assert names == expected


@pytest.mark.slow
@pytest.mark.parametrize("dist_dir", DISTRIBUTIONS, ids=lambda d: d.name)
def test_builds_wheel_and_sdist(dist_dir: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-d", str(tmp_path)],
        cwd=dist_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    wheels = list(tmp_path.glob("*.whl"))
    sdists = list(tmp_path.glob("*.tar.gz"))
    built = sorted(p.name for p in tmp_path.iterdir())
    assert len(wheels) == 1, built
    assert len(sdists) == 1, built
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(metadata_name).decode()
        entry_points = next((wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")), "")
    assert "rallypoint/__init__.py" not in names, "the rallypoint namespace must stay PEP 420"
    short = dist_dir.name.removeprefix("rallypoint-")
    if short in FRAMEWORK:
        assert f"rallypoint/{short}/__init__.py" in names
        assert f"rallypoint/{short}/py.typed" in names
    elif short in PLUGINS:
        assert f"rallypoint_{short}/hooks.py" in names
        assert f"rallypoint_{short}/py.typed" in names
        assert f"{short} = rallypoint_{short}.hooks" in entry_points
    required = {
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    }
    for dep in _project(dist_dir).get("dependencies", []):
        assert Requirement(dep) in required, f"{dep} is not declared in the wheel metadata"


def _imported_distributions(src: Path) -> set[str]:
    found = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            for module in modules:
                parts = module.split(".")
                if parts[0] == "rallypoint" and len(parts) > 1:
                    found.add(f"rallypoint-{parts[1]}")
                elif parts[0].startswith("rallypoint_"):
                    found.add("rallypoint-" + parts[0].removeprefix("rallypoint_"))
    return found


@pytest.mark.parametrize("dist_dir", [d for d in DISTRIBUTIONS if d.name != "rallypoint"], ids=lambda d: d.name)
def test_imports_of_other_distributions_are_declared(dist_dir: Path) -> None:
    project = _project(dist_dir)
    declared = {Requirement(dep).name for dep in project.get("dependencies", [])}
    # Dependencies of dependencies count: rallypoint-rendezvous brings rallypoint-core.
    closure = set(declared)
    for dep in declared:
        dep_dir = next((d for d in DISTRIBUTIONS if d.name == dep), None)
        if dep_dir is not None:
            closure |= {Requirement(x).name for x in _project(dep_dir).get("dependencies", [])}
    imported = _imported_distributions(dist_dir / "src") - {project["name"]}
    missing = sorted(imported - closure)
    assert not missing, f"{project['name']} imports {missing} without declaring them"


def test_one_wait_more_answers_every_timeout() -> None:
    """A rendezvous hook and a collective's handler answer "keep waiting" with the same class (#37)."""
    from rallypoint import collectives
    from rallypoint.core.wait_more import WaitMore
    from rallypoint.rendezvous import errors

    assert collectives.WaitMore is WaitMore
    assert errors.WaitMore is WaitMore
    assert WaitMore(2.5).seconds == 2.5
    with pytest.raises(ValueError, match="finite number of seconds > 0"):
        WaitMore(float("inf"))
