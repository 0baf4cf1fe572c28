"""``pip install rallypoint-core`` alone, in a fresh virtual environment: core works without the rest."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: packages/rallypoint-core, found from this file (tests/ is inside it).
PACKAGE_DIR = Path(__file__).resolve().parents[1]


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


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_core_alone_in_a_fresh_venv(tmp_path: Path) -> None:
    assert (PACKAGE_DIR / "pyproject.toml").read_text().count('name = "rallypoint-core"') == 1
    venv = tmp_path / "venv"
    created = _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    bin_dir = venv / "bin"

    installed = _run([bin_dir / "python", "-m", "pip", "install", PACKAGE_DIR], cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    # nothing but core and its three dependencies: no torch, no other rallypoint package
    probe = _run(
        [
            bin_dir / "python",
            "-c",
            "import importlib.util as u; print([m for m in ('torch', 'rallypoint.rendezvous', 'rallypoint.agent') "
            "if u.find_spec(m)])",
        ],
        cwd=tmp_path,
    )
    assert probe.stdout.strip() == "[]", probe.stderr

    listed = _run([bin_dir / "rallypoint", "plugins", "list"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == ""
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["PLUGIN", "DISTRIBUTION", "REGISTERS"]
    version = importlib.metadata.version("rallypoint-core")  # the workspace's, built from the same source
    assert lines[1].split() == ["core", "*", "rallypoint-core", version, "CLI", "command:", "plugins,", "config"]
    assert lines[2:] == ["", "* built-in package (registered without an entry point)"]

    # a job that keeps the defaults checks fine without the subsystem packages
    (tmp_path / "job.toml").write_text('[job]\nentrypoint = "train.py"\n[nodes]\nmin = 2\n')
    checked = _run([bin_dir / "rallypoint", "config", "check", "job.toml"], cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert 'backend = "memory"  # default; rallypoint-rendezvous not installed' in checked.stdout.splitlines()
    assert 'backend = "auto"  # default; rallypoint-collectives not installed' in checked.stdout.splitlines()

    # naming a backend says what to install
    (tmp_path / "etcd.toml").write_text('[rendezvous]\nbackend = "etcd"\n')
    refused = _run([bin_dir / "rallypoint", "config", "check", "etcd.toml"], cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr == (
        "error: etcd.toml: rendezvous.backend: rendezvous backend 'etcd' needs rallypoint-rendezvous, "
        "which is not installed; pip install rallypoint-rendezvous\n"
    )
