"""Shared fixtures of the rallypoint-core tests.

Core's tests import nothing from other rallypoint packages and pass in a virtual environment
holding ``rallypoint-core`` alone (``test_fresh_install.py`` checks that). They exercise core with
a made-up subsystem installed next to it, in ``tests/installed``:

- ``acme-widgets`` (module ``acme_widgets``), an *essential* package (entry-point group
  ``rallypoint.essential``): hook specifications, plugin kinds (widget backends, gadget makers,
  inspectors, couriers, widget parts) and job-file sections (``[widgets]``, ``[gadgets]``,
  ``[inspection]`` and the optional ``[delivery]``);
- ``acme-cogs`` (module ``acme_cogs``), a plugin of it (entry-point group ``rallypoint``).

Every test runs as if exactly these were installed next to core: the autouse ``installed``
fixture puts ``tests/installed`` on ``sys.path`` and hides the entry points of the other rallypoint
distributions of the workspace (see ``isolation/sitecustomize.py``); ``run_cli`` does the same for
subprocesses. ``core_alone`` hides the fakes too.

Every test builds its own plugin manager (``get_plugin_manager(...)``), so the tests run in any
order and in parallel (``-n 2``). Third-party plugins are simulated with real distributions
written to ``tmp_path`` (a module plus a ``*.dist-info`` directory) and put on ``sys.path`` or
``PYTHONPATH``: that is exactly how an installed plugin is discovered.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from rallypoint.core.plugins import RallypointPluginManager, get_plugin_manager, hookimpl
from rallypoint.core.records import Requirement

TESTS = Path(__file__).resolve().parent
#: The made-up subsystem and its plugin, installed as distributions.
SITE = TESTS / "installed"
#: ``sitecustomize`` hiding the workspace's other rallypoint distributions from subprocesses.
ISOLATION = TESTS / "isolation"
#: The distributions in :data:`SITE`.
FAKE_DISTRIBUTIONS = ("acme-widgets", "acme-cogs")

# Import the fakes once, so that test modules can import their names; ``sys.path`` is restored
# at once (the ``installed`` fixture puts SITE back for each test), so the fake distributions
# are never visible to the tests of other packages run in the same process.
sys.path.insert(0, str(SITE))
try:
    import acme_cogs  # noqa: F401
    import acme_widgets
finally:
    sys.path.remove(str(SITE))

_spec = importlib.util.spec_from_file_location("rp_core_test_isolation", ISOLATION / "sitecustomize.py")
assert _spec is not None
assert _spec.loader is not None
isolation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(isolation)
_REAL_ENTRY_POINTS = importlib.metadata.entry_points

#: The ``rallypoint`` console script of the environment running the tests.
RALLYPOINT_SCRIPT = Path(sys.executable).with_name("rallypoint")
#: Run the CLI through the Python running the tests.
CLI_VIA_PYTHON = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]


@pytest.fixture(autouse=True)
def installed(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Core plus the fakes of ``tests/installed``, nothing else; returns the set of hidden distributions."""
    hidden: set[str] = set()
    monkeypatch.setattr(importlib.metadata, "entry_points", isolation.filtered(_REAL_ENTRY_POINTS, hidden))
    monkeypatch.syspath_prepend(str(SITE))
    return hidden


@pytest.fixture
def core_alone(installed: set[str]) -> None:
    """Hide the fake subsystem and its plugin too: rallypoint-core is all there is."""
    installed.update(FAKE_DISTRIBUTIONS)


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def clean_env(
    extra: Mapping[str, str] | None = None, hidden: set[str] | frozenset[str] = frozenset()
) -> dict[str, str]:
    """The environment of a CLI subprocess: no ``RALLYPOINT_*`` variable, the same isolation as in-process.

    ``PYTHONPATH`` in ``extra`` (fake third-party plugins) comes after the isolation and the fakes.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    env.pop("PYTHONPATH", None)
    extra = dict(extra or {})
    paths = [str(ISOLATION), str(SITE), *([extra.pop("PYTHONPATH")] if "PYTHONPATH" in extra else [])]
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[isolation.HIDDEN_ENV] = ",".join(sorted(hidden))
    return env


@pytest.fixture
def run_cli(tmp_path: Path, installed: set[str]) -> Callable[..., CliResult]:
    """Run ``rallypoint ARGS...`` in a subprocess (cwd ``tmp_path``) and return its result.

    ``script=True`` runs the installed console script; otherwise the CLI runs through
    ``sys.executable -c``. Both see what the in-process tests see (core, the fakes unless
    ``core_alone``, and whatever ``PYTHONPATH`` the test adds).
    """

    def run(*args: str, env: Mapping[str, str] | None = None, script: bool = False) -> CliResult:
        command = [str(RALLYPOINT_SCRIPT)] if script else list(CLI_VIA_PYTHON)
        proc = subprocess.run(
            [*command, *args],
            cwd=tmp_path,
            env=clean_env(env, installed),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def make_distribution() -> Callable[..., str]:
    """Write a fake installed distribution: a top-level module and its ``.dist-info``.

    Returns the module's name (made unique per call, so that modules imported by one test never
    shadow another test's).
    """

    def make(
        where: Path,
        *,
        dist: str,
        version: str = "1.0",
        entry_point: str,
        source: str,
        module: str | None = None,
        group: str = "rallypoint",
    ) -> str:
        module = module or f"rp_test_{entry_point.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        where.mkdir(parents=True, exist_ok=True)
        (where / f"{module}.py").write_text(textwrap.dedent(source))
        info = where / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[{group}]\n{entry_point} = {module}\n")
        return module

    return make


@pytest.fixture
def job_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Write ``job.toml`` in ``tmp_path``, make ``tmp_path`` the working directory, return ``"job.toml"``."""
    monkeypatch.chdir(tmp_path)

    def write(text: str, name: str = "job.toml") -> str:
        (tmp_path / name).write_text(textwrap.dedent(text))
        return name

    return write


# ---------------------------------------------------------------------------------------------
# A test plugin registering one thing of every kind of the widgets subsystem.


class AcmePlugin:
    """Registers widget backends ``testkv`` (alias ``tkv``, with options) and ``needy`` (a missing
    requirement), gadget maker ``testmaker``, inspector ``testinspector`` and courier ``testcourier``."""

    @hookimpl
    def rallypoint_widget_backends(self) -> list[acme_widgets.WidgetBackendRecord]:
        return [
            acme_widgets.WidgetBackendRecord(
                name="testkv",
                aliases=("tkv",),
                summary="test key-value widgets",
                factory="acme.kv:Backend",
                options_model=acme_widgets.CogOptions,
            ),
            acme_widgets.WidgetBackendRecord(
                name="needy",
                factory="acme.needy:Backend",
                requires=(Requirement(module="surely_not_installed_mod", install="x"),),
            ),
        ]

    @hookimpl
    def rallypoint_gadget_makers(self) -> list[acme_widgets.GadgetMakerRecord]:
        return [acme_widgets.GadgetMakerRecord(name="testmaker", factory="acme.maker:make")]

    @hookimpl
    def rallypoint_inspectors(self) -> list[acme_widgets.InspectorRecord]:
        return [acme_widgets.InspectorRecord(name="testinspector", factory="acme.inspect:Inspector")]

    @hookimpl
    def rallypoint_couriers(self) -> list[acme_widgets.CourierRecord]:
        return [acme_widgets.CourierRecord(name="testcourier", factory="acme.courier:Courier")]


def build_acme_pm(**kwargs: object) -> RallypointPluginManager:
    """A fresh manager: core, the widgets subsystem and :class:`AcmePlugin` (as ``acme``), no autoload."""
    return get_plugin_manager(plugins={"acme": AcmePlugin()}, autoload=False, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def acme_pm() -> RallypointPluginManager:
    """A fresh manager: core, the widgets subsystem and :class:`AcmePlugin` as ``acme``."""
    return build_acme_pm()


@pytest.fixture
def acme_plugin() -> AcmePlugin:
    """An :class:`AcmePlugin`, to register with other test plugins."""
    return AcmePlugin()


#: A job whose every selection is satisfied by :class:`AcmePlugin`.
ACME_JOB = """\
[widgets]
name = "demo"
backend = "testkv"
[widgets.options]
endpoints = ["http://10.0.0.5:2379"]

[gadgets]
maker = "testmaker"
"""


@pytest.fixture
def acme_job() -> str:
    return ACME_JOB


@pytest.fixture
def cli_with_acme(monkeypatch: pytest.MonkeyPatch) -> list[RallypointPluginManager]:
    """Make the in-process CLI (``rallypoint.core.cli.main``) use core, the widgets and :class:`AcmePlugin`.

    Returns the list of managers the CLI built (one per invocation).
    """
    import rallypoint.core.plugins

    built: list[RallypointPluginManager] = []

    def fake_get_plugin_manager(**kwargs: object) -> RallypointPluginManager:
        assert not kwargs, "the CLI builds its manager from the environment"
        pm = build_acme_pm()
        built.append(pm)
        return pm

    monkeypatch.setattr(rallypoint.core.plugins, "get_plugin_manager", fake_get_plugin_manager)
    return built
