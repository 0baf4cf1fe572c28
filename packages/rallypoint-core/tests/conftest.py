"""Shared fixtures of the rallypoint-core tests.

Every test builds its own plugin manager (``get_plugin_manager(...)``), so the tests run in any
order and in parallel (``-n 2``). Third-party plugins are simulated with real distributions
written to ``tmp_path`` (a module plus a ``*.dist-info`` directory) and put on ``sys.path`` or
``PYTHONPATH``: that is exactly how an installed plugin is discovered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from rallypoint.agent.records import RankStrategyRecord
from rallypoint.collectives.records import CollectiveBackendRecord
from rallypoint.core.config import Duration
from rallypoint.core.plugins import RallypointPluginManager, get_plugin_manager, hookimpl
from rallypoint.core.records import Requirement
from rallypoint.rendezvous.records import RendezvousBackendRecord
from rallypoint.rpc.records import RpcTransportRecord
from rallypoint.timer.records import TimerBackendRecord

#: The ``rallypoint`` console script of the environment running the tests.
RALLYPOINT_SCRIPT = Path(sys.executable).with_name("rallypoint")
#: Run the CLI through the Python running the tests (PYTHONPATH applies, unlike a console script
#: of another environment).
CLI_VIA_PYTHON = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment without any ``RALLYPOINT_*`` variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    env.pop("PYTHONPATH", None)
    env.update(extra or {})
    return env


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., CliResult]:
    """Run ``rallypoint ARGS...`` in a subprocess (cwd ``tmp_path``) and return its result.

    ``script=True`` runs the installed console script; otherwise the CLI runs through
    ``sys.executable -c`` so that ``PYTHONPATH`` (fake installed plugins) applies.
    """

    def run(*args: str, env: Mapping[str, str] | None = None, script: bool = False) -> CliResult:
        command = [str(RALLYPOINT_SCRIPT)] if script else list(CLI_VIA_PYTHON)
        proc = subprocess.run(
            [*command, *args],
            cwd=tmp_path,
            env=clean_env(env),
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
    ) -> str:
        module = module or f"rp_test_{entry_point.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        where.mkdir(parents=True, exist_ok=True)
        (where / f"{module}.py").write_text(textwrap.dedent(source))
        info = where / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[rallypoint]\n{entry_point} = {module}\n")
        return module

    return make


@pytest.fixture
def job_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """Write ``job.toml`` in ``tmp_path``, make ``tmp_path`` the working directory, return ``"job.toml"``."""
    monkeypatch.chdir(tmp_path)

    def write(text: str, name: str = "job.toml") -> str:
        (tmp_path / name).write_text(textwrap.dedent(text))
        return name

    return write


# ---------------------------------------------------------------------------------------------
# A test plugin registering one thing of every kind, for phase 2 of config and the CLI.


class KvOptions(BaseModel):
    """``[rendezvous.options]`` of the ``testkv`` backend."""

    model_config = ConfigDict(extra="forbid")
    endpoints: list[str]
    retries: int = Field(default=3, ge=0)
    timeout: Duration = 5.0


class AcmePlugin:
    """Registers ``testkv`` (alias ``tkv``) and ``needy`` rendezvous backends, ``testranks``,
    ``testcoll``, ``testtimer`` and ``testrpc``."""

    @hookimpl
    def rallypoint_rendezvous_backends(self) -> list[RendezvousBackendRecord]:
        return [
            RendezvousBackendRecord(
                name="testkv",
                aliases=("tkv",),
                summary="test key-value backend",
                factory="acme.kv:Backend",
                options_model=KvOptions,
            ),
            RendezvousBackendRecord(
                name="needy",
                factory="acme.needy:Backend",
                requires=(Requirement(module="surely_not_installed_mod", install="x"),),
            ),
        ]

    @hookimpl
    def rallypoint_rank_strategies(self) -> list[RankStrategyRecord]:
        return [RankStrategyRecord(name="testranks", factory="acme.ranks:assign")]

    @hookimpl
    def rallypoint_collective_backends(self) -> list[CollectiveBackendRecord]:
        return [CollectiveBackendRecord(name="testcoll", torch_backend="gloo")]

    @hookimpl
    def rallypoint_timer_backends(self) -> list[TimerBackendRecord]:
        return [TimerBackendRecord(name="testtimer", factory="acme.timer:Timers")]

    @hookimpl
    def rallypoint_rpc_transports(self) -> list[RpcTransportRecord]:
        return [RpcTransportRecord(name="testrpc", factory="acme.rpc:Transport")]


def build_acme_pm(**kwargs: object) -> RallypointPluginManager:
    """A fresh manager with the built-ins and :class:`AcmePlugin` (as ``acme``), no entry points."""
    return get_plugin_manager(plugins={"acme": AcmePlugin()}, autoload=False, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def acme_pm() -> RallypointPluginManager:
    """A fresh manager: the built-ins and :class:`AcmePlugin` as ``acme``."""
    return build_acme_pm()


@pytest.fixture
def acme_plugin() -> AcmePlugin:
    """An :class:`AcmePlugin`, to register with other test plugins."""
    return AcmePlugin()


#: A job whose every selection is satisfied by :class:`AcmePlugin`.
ACME_JOB = """\
[job]
entrypoint = "train.py"

[rendezvous]
backend = "testkv"
[rendezvous.options]
endpoints = ["http://10.0.0.5:2379"]

[ranks]
strategy = "testranks"

[collectives]
backend = "testcoll"
"""


@pytest.fixture
def acme_job() -> str:
    return ACME_JOB


@pytest.fixture
def cli_with_acme(monkeypatch: pytest.MonkeyPatch) -> list[RallypointPluginManager]:
    """Make the in-process CLI (``rallypoint.core.cli.main``) use built-ins + :class:`AcmePlugin`.

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
