"""Every kind of plugin ``rallypoint plugin new`` writes is declared by the package that accepts it.

Core names none of them: each subsystem declares its kinds (``rallypoint_plugin_templates``) and
ships their templates. Here, with the whole workspace installed: who declares what, and that
each kind writes a complete distribution. ``test_authoring_install.py`` (the meta-package's tests)
installs the generated plugins and runs their tests.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from rallypoint.core.authoring.kinds import installed_kinds
from rallypoint.core.cli import main
from rallypoint.core.plugins import get_plugin_manager

DECLARED_BY = {
    "cli-command": "rallypoint.agent",
    "collective-backend": "rallypoint.collectives",
    "hooks": "rallypoint.agent",
    "rank-strategy": "rallypoint.agent",
    "rendezvous-backend": "rallypoint.rendezvous",
    "rpc-transport": "rallypoint.rpc",
    "timer-backend": "rallypoint.timer",
}
PLACEHOLDER = re.compile(
    r"__(NAME|DIST|MODULE|CLASS|ENVVAR|KIND|SUMMARY|HOOK|IMPL|DEPENDENCIES|TESTING|EXPECTED|KIT_NOTE|SELECTS_NOTE)__"
)


def test_each_kind_comes_from_the_package_that_accepts_it() -> None:
    kinds = installed_kinds(get_plugin_manager())
    assert {k.name: k.package for k in kinds} == DECLARED_BY
    for kind in kinds:
        assert kind.directory == f"plugin_templates/{kind.name}"


@pytest.mark.parametrize("kind", sorted(DECLARED_BY))
def test_plugin_new_writes_a_complete_distribution(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plugin", "new", kind, "fast-ring", "--dir", str(tmp_path)]) == 0

    root = tmp_path / "rallypoint-fast-ring"
    assert capsys.readouterr().out.startswith(f"wrote rallypoint-fast-ring ({kind}) in {root}:\n")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["name"] == "rallypoint-fast-ring"
    assert project["entry-points"]["rallypoint"] == {"fast-ring": "rallypoint_fast_ring.hooks"}
    assert {"pytest>=8", "pytest-xdist>=3.5"} <= set(project["optional-dependencies"]["testing"])
    assert all(r.endswith(">=0.1,<0.2") for r in project["dependencies"] if r.startswith("rallypoint"))
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert {
        "README.md",
        "pyproject.toml",
        "src/rallypoint_fast_ring/hooks.py",
        "src/rallypoint_fast_ring/py.typed",
    } <= set(files)
    assert any(f.startswith("tests/test_") and f.endswith("_plugin.py") for f in files)
    for name in files:
        text = (root / name).read_text()
        assert not PLACEHOLDER.search(text), f"{name}: {PLACEHOLDER.search(text)}"
        assert "__module__" not in name
        if name.endswith(".py"):
            compile(text, name, "exec")  # valid Python


def test_the_kit_is_used_where_one_exists(tmp_path: Path) -> None:
    kits = 0
    for kind in installed_kinds(get_plugin_manager()):
        assert main(["plugin", "new", kind.name, "k", "--dir", str(tmp_path / kind.name)]) == 0
        tests = (tmp_path / kind.name / "rallypoint-k" / "tests" / "test_rallypoint_k_plugin.py").read_text()
        if kind.conformance_kit:
            kits += 1
            assert f"from {kind.conformance_kit} import" in tests, kind.name
    assert kits == 3  # rendezvous backends, rank strategies, collective backends
