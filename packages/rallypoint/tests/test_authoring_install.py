"""Packaging and plugin authoring, as a packager and a plugin author meet them: in a fresh venv.

One virtual environment serves the whole module (building it is most of the cost):

1. ``tools/dist.py`` (``hatch run dist``) builds every wheel and sdist of the workspace into a
   temporary ``dist/`` and checks them (``twine check --strict`` and the metadata rules);
2. the venv gets the third-party dependencies from the package index (torch pinned to the CPU
   build the workspace uses), then the meta-package from ``dist/`` alone, with pip
   (``pip install --no-index --find-links dist rallypoint``): every rallypoint requirement must
   resolve from the built files. The third-party part is most of the cost (torch unpacks to
   750 MB): where ``uv`` is on PATH it creates the venv and installs them (from its cache, a few
   seconds once warm; pip's find-links from ``PIP_FIND_LINKS`` or pip's configuration are passed
   on, so torch's CPU wheel is found), else ``python -m venv`` and pip do (minutes);
3. ``rallypoint plugin new`` writes one plugin of every kind, and pip installs all of them with
   their ``[testing]`` extras from ``dist/``.

The tests then run a job with the meta-package, check what it depends on, run ``rallypoint
plugin check`` on every generated plugin, and run every generated plugin's own tests (the
conformance kits and a ``rallypoint run`` job selecting the plugin) in the venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
#: Third-party packages the venv needs before rallypoint's own wheels (torch: the workspace's CPU build).
THIRD_PARTY = [
    "torch==2.13.0",
    "numpy",
    "pluggy>=1.5",
    "pydantic>=2.7,<3",
    "click>=8.1",
    "grpcio>=1.85,<2",
    "protobuf>=7.35.1,<8",
    "hatchling>=1.26",  # builds the generated plugins (--no-build-isolation: nothing downloaded per plugin)
    "pytest>=8",
    "pytest-xdist>=3.5",
    "pytest-timeout>=2.3",
]
KINDS = (
    "rendezvous-backend",
    "rank-strategy",
    "collective-backend",
    "timer-backend",
    "rpc-transport",
    "cli-command",
    "hooks",
)


def _env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RALLYPOINT_", "RP_TEST_")) and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }


def _run(args: list[str | Path], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def _ok(result: subprocess.CompletedProcess[str], what: str) -> str:
    assert result.returncode == 0, (
        f"{what} failed ({result.returncode}):\n{result.stdout[-6000:]}{result.stderr[-4000:]}"
    )
    return result.stdout


@dataclass
class Venv:
    where: Path
    dist: Path
    bin: Path
    plugins: Path
    dist_output: str
    seconds: dict[str, float]

    def run(self, *args: str | Path, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return _run([*args], cwd=cwd or self.where, timeout=timeout)


def _find_links() -> list[str]:
    """pip's find-links (where torch's CPU wheel may be kept), for uv, which reads no pip configuration."""
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    config = _run([sys.executable, "-m", "pip", "config", "get", "global.find-links"], cwd=ROOT)
    if config.returncode == 0:
        found += config.stdout.split()
    return [arg for link in dict.fromkeys(found) for arg in ("--find-links", link)]


def _third_party(where: Path) -> Path:
    """Create the venv with the third-party dependencies; return its python."""
    venv = where / "venv"
    uv = shutil.which("uv")
    if uv:
        _ok(_run([uv, "venv", "-q", "--seed", "-p", sys.executable, venv], cwd=where), "uv venv")
        install = [uv, "pip", "install", "-q", "--python", venv / "bin" / "python", *_find_links()]
    else:
        _ok(_run([sys.executable, "-m", "venv", venv], cwd=where), "python -m venv")
        install = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile"]
    _ok(_run([*install, *THIRD_PARTY], cwd=where), "installing third-party dependencies")
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Venv:
    """The module's venv, built once even when pytest-xdist spreads these tests over processes."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):  # an xdist worker: the workers share the parent directory
        base = base.parent
    where = base / "packaging"
    ready, failed = where / "ready.json", base / "packaging-failed.txt"
    with FileLock(str(base / "packaging.lock")):
        if failed.exists():  # another worker tried and failed: one failure, not a second build
            pytest.fail(f"building the packaging venv failed (see the other worker):\n{failed.read_text()}")
        if not ready.exists():
            where.mkdir(exist_ok=True)
            try:
                built, seconds = _build(where)
            except BaseException as exc:
                failed.write_text(str(exc))
                raise
            ready.write_text(json.dumps({"dist_output": built, "seconds": seconds}))
    state = json.loads(ready.read_text())
    bin_dir = where / "venv" / "bin"
    return Venv(where, where / "dist", bin_dir, where / "plugins", state["dist_output"], state["seconds"])


def _build(where: Path) -> tuple[str, dict[str, float]]:
    seconds: dict[str, float] = {}
    start = time.monotonic()
    dist = where / "dist"
    built = _ok(_run([sys.executable, ROOT / "tools" / "dist.py", "--out", dist], cwd=ROOT), "hatch run dist")
    seconds["dist"] = time.monotonic() - start
    python = _third_party(where)
    pip = [python, "-m", "pip", "install", "-q", "--no-compile"]
    seconds["third-party"] = time.monotonic() - start - seconds["dist"]
    _ok(_run([*pip, "--no-index", "--find-links", dist, "rallypoint"], cwd=where), "pip install rallypoint from dist/")
    plugins = where / "plugins"
    generate = [where / "venv" / "bin" / "rallypoint", "plugin", "new"]
    for kind in KINDS:
        _ok(_run([*generate, kind, f"my-{kind}", "--dir", plugins], cwd=where), f"rallypoint plugin new {kind}")
    targets = [f"{plugins / f'rallypoint-my-{kind}'}[testing]" for kind in KINDS]
    _ok(
        _run([*pip, "--no-index", "--find-links", dist, "--no-build-isolation", *targets], cwd=where),
        "pip install of the generated plugins",
    )
    seconds["total setup"] = time.monotonic() - start
    return built, seconds


def test_dist_builds_a_wheel_and_an_sdist_of_every_member_and_their_metadata_passes(venv: Venv) -> None:
    members = [p.parent for p in ROOT.glob("packages/*/pyproject.toml")] + [
        p.parent for p in ROOT.glob("plugins/*/pyproject.toml")
    ]
    names = {tomllib.loads((m / "pyproject.toml").read_text())["project"]["name"].replace("-", "_") for m in members}
    files = sorted(p.name for p in venv.dist.iterdir())

    assert files == sorted([f"{n}-0.1.0-py3-none-any.whl" for n in names] + [f"{n}-0.1.0.tar.gz" for n in names])
    assert "metadata: ok (twine check --strict" in venv.dist_output
    # pip install "rallypoint-<package>[testing]" brings the test tools with every package that has a kit
    for package in ("rendezvous", "agent", "collectives", "core", "timer", "rpc"):
        with zipfile.ZipFile(venv.dist / f"rallypoint_{package}-0.1.0-py3-none-any.whl") as wheel:
            meta = wheel.read(f"rallypoint_{package}-0.1.0.dist-info/METADATA").decode()
        assert "Provides-Extra: testing" in meta, package
        for tool in ("pytest>=8", "pytest-xdist>=3.5", "pytest-timeout>=2.3"):
            assert f"Requires-Dist: {tool}; extra == 'testing'" in meta, (package, tool)


def test_the_meta_package_from_dist_runs_a_job(venv: Venv, tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(
        '[job]\nname = "meta"\nentrypoint = "worker.py"\n[nodes]\nmin = 1\nmax = 1\nnproc_per_node = 2\n'
        '[rendezvous]\nbackend = "file"\n[rendezvous.options]\npath = "rdzv"\n'
        '[collectives]\nbackend = "gloo"\n[ranks]\nstrategy = "topology"\n'
    )
    (tmp_path / "worker.py").write_text(
        "import torch\nfrom rallypoint import collectives\n"
        "info = collectives.init()\nt = torch.tensor([info.rank + 1.0])\ncollectives.all_reduce(t)\n"
        "print(f'RESULT {info.rank} {info.backend} {t.item()}', flush=True)\ncollectives.destroy()\n"
    )

    result = venv.run(venv.bin / "rallypoint", "run", "job.toml", cwd=tmp_path, timeout=300)

    out = _ok(result, "rallypoint run with the meta-package")
    assert "RESULT 0 gloo 3.0" in out + result.stderr
    assert "RESULT 1 gloo 3.0" in out + result.stderr


def test_the_meta_package_depends_only_on_plugins_that_register_something(venv: Venv) -> None:
    probe = "import importlib.metadata as m, json\nreqs = m.requires('rallypoint')\nprint(json.dumps(reqs))\n"
    requires = json.loads(_ok(venv.run(venv.bin / "python", "-c", probe), "reading the meta-package's requirements"))
    listed = json.loads(_ok(venv.run(venv.bin / "rallypoint", "plugins", "list", "--json"), "plugins list --json"))
    by_distribution = {row["distribution"]: row for row in listed["plugins"]}

    parsed = [Requirement(r) for r in requires]
    plain = {r.name for r in parsed if r.marker is None}
    extras = {r.name for r in parsed if r.marker is not None}
    assert extras == {"rallypoint-etcd", "rallypoint-nccl"}
    for distribution in plain:
        row = by_distribution[distribution]
        if not row["essential"]:
            assert row["registers"], f"{distribution} is a dependency of rallypoint but registers nothing"
    assert {"rallypoint-file", "rallypoint-grpc", "rallypoint-gloo", "rallypoint-ranks"} <= plain


def test_plugin_check_passes_every_generated_plugin(venv: Venv) -> None:
    checks = {
        kind: subprocess.Popen(
            [venv.bin / "rallypoint", "plugin", "check", f"rallypoint-my-{kind}"],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for kind in KINDS
    }
    outputs = {kind: proc.communicate(timeout=300) for kind, proc in checks.items()}

    for kind, (out, err) in outputs.items():
        assert checks[kind].returncode == 0, f"{kind}:\n{out}{err}"
        assert f"plugin my-{kind} (rallypoint_my_{kind.replace('-', '_')}.hooks)" in out
        assert out.rstrip().endswith("the hook modules import nothing heavy"), out
    assert (
        "  rank strategy: my-rank-strategy (options: rallypoint_my_rank_strategy.options."
        in outputs["rank-strategy"][0]
    )
    assert "  CLI command: my-cli-command - " in outputs["cli-command"][0]
    assert (
        "hooks rallypoint_agent_should_restart, rallypoint_agent_worker_failed, rallypoint_worker_env"
        in (outputs["hooks"][0])
    )


def test_every_generated_plugin_passes_its_own_tests_in_the_venv(venv: Venv) -> None:
    (venv.plugins / "pytest.ini").write_text("[pytest]\n")  # one root for the seven projects
    tests = [venv.plugins / f"rallypoint-my-{kind}" / "tests" for kind in KINDS]

    result = venv.run(
        venv.bin / "python", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
        "--import-mode=importlib", "--timeout=300", "--durations=10", *tests, cwd=venv.plugins, timeout=800,
    )  # fmt: skip

    out = _ok(result, "the generated plugins' tests")
    print(out[out.find("slowest") :])
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary
    assert "failed" not in summary
    assert "skipped" not in summary
    print(f"venv timings (s): {venv.seconds}")
