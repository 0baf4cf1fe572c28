"""Every distribution that requires torch requires NumPy too (#41).

torch imports NumPy when it is there and warns ``Failed to initialize NumPy`` on every import
when it is not, and torch's wheels do not require it: a pip-installed job printed the warning
once per worker. The first test shows the warning is real for the torch installed here.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = sorted([*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("plugins/*/pyproject.toml")])


def test_torch_without_numpy_warns_on_import() -> None:
    code = "import sys; sys.modules['numpy'] = None; import torch"
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Failed to initialize NumPy" in done.stderr


@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.parent.name)
def test_a_distribution_that_requires_torch_requires_numpy(project: Path) -> None:
    deps = [Requirement(d).name for d in tomllib.loads(project.read_text())["project"].get("dependencies", [])]
    if "torch" in deps:
        assert "numpy" in deps, f"{project.relative_to(ROOT)}: requires torch but not numpy (torch warns without it)"
