"""Third-party plugins installed next to rallypoint, seen through the real CLI in a subprocess.

Each test writes a distribution (a module and its ``.dist-info`` with a ``rallypoint`` entry
point) into ``tmp_path`` and puts it on ``PYTHONPATH``: the same discovery as ``pip install``.
"""

from __future__ import annotations

import importlib.metadata
import json
import tomllib
from pathlib import Path

import pytest

BROKEN_WARNING = (
    "warning: plugin 'broken' (brokenplug 1.0) failed to load: ImportError: libbroken.so: cannot open shared "
    "object file. Reinstall it (pip install --force-reinstall brokenplug), or disable it with "
    "RALLYPOINT_DISABLE_PLUGINS=broken"
)


@pytest.fixture
def broken_plugin(tmp_path: Path) -> dict[str, str]:
    """``brokenplug 1.0``: entry point ``broken = broken_plugin``, whose import raises ImportError."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "broken_plugin.py").write_text('raise ImportError("libbroken.so: cannot open shared object file")\n')
    info = site / "brokenplug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[rallypoint]\nbroken = broken_plugin\n")
    return {"PYTHONPATH": str(site)}


def test_plugins_list_survives_a_broken_plugin(run_cli, broken_plugin) -> None:
    result = run_cli("plugins", "list", env=broken_plugin)

    assert result.returncode == 0
    assert BROKEN_WARNING in result.stderr.splitlines()
    assert "Traceback" not in result.stderr
    stdout = result.stdout
    failed = stdout[stdout.index("\nfailed to load:\n") :]
    assert BROKEN_WARNING.removeprefix("warning: ") in failed
    table = stdout[: stdout.index("\nfailed to load:\n")]
    assert "\nbroken " not in table  # not listed as a working plugin
    assert "\ngloo " in table  # the others still are


def test_plugins_list_json_reports_the_failure(run_cli, broken_plugin) -> None:
    result = run_cli("plugins", "list", "--json", env=broken_plugin)

    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["failed"] == [
        {
            "name": "broken",
            "distribution": "brokenplug",
            "version": "1.0",
            "error": BROKEN_WARNING.removeprefix("warning: "),
        }
    ]
    assert "broken" not in [p["name"] for p in data["plugins"]]


def test_selecting_the_broken_plugin_is_a_clear_error(run_cli, broken_plugin, tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text('[rendezvous]\nbackend = "broken"\n')

    result = run_cli("config", "check", "job.toml", env=broken_plugin)

    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert (
        "error: job.toml: rendezvous.backend: plugin 'broken' (brokenplug 1.0) failed to load: ImportError: "
        "libbroken.so: cannot open shared object file. Reinstall it (pip install --force-reinstall brokenplug), "
        "or disable it with RALLYPOINT_DISABLE_PLUGINS=broken"
    ) in result.stderr.splitlines()


def test_disabling_the_broken_plugin_silences_it(run_cli, broken_plugin) -> None:
    result = run_cli("plugins", "list", env={**broken_plugin, "RALLYPOINT_DISABLE_PLUGINS": "broken"})

    assert result.returncode == 0
    assert result.stderr == ""
    assert "failed to load" not in result.stdout
    assert result.stdout.rstrip().endswith("disabled by RALLYPOINT_DISABLE_PLUGINS: broken")


def test_autoload_off_does_not_even_try_the_broken_plugin(run_cli, broken_plugin) -> None:
    result = run_cli("plugins", "list", env={**broken_plugin, "RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": "1"})

    assert result.returncode == 0
    assert result.stderr == ""
    assert "broken" not in result.stdout


# ---------------------------------------------------------------------------------------------
# A working third-party plugin: a rendezvous backend with options and a rank strategy

ACME_SOURCE = '''
"""rp-acme: a third-party rallypoint plugin."""

from pydantic import BaseModel, ConfigDict

from rallypoint.agent.records import RankStrategyRecord
from rallypoint.core.plugins import hookimpl
from rallypoint.rendezvous.records import RendezvousBackendRecord


class RedisOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    db: int = 0


@hookimpl
def rallypoint_rendezvous_backends():
    return [RendezvousBackendRecord(name="acme-redis", aliases=("redis",), summary="Redis streams",
                                    factory="rp_acme_impl:Backend", options_model=RedisOptions)]


@hookimpl
def rallypoint_rank_strategies():
    return [RankStrategyRecord(name="acme-rack", summary="racks first", factory="rp_acme_impl:assign")]
'''

ACME_JOB = """\
[job]
entrypoint = "train.py"

[nodes]
min = 2

[rendezvous]
backend = "redis"
[rendezvous.options]
url = "redis://10.0.0.7:6379"

[ranks]
strategy = "acme-rack"

[collectives]
backend = "gloo"
"""


@pytest.fixture
def acme_plugin(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "rp_acme.py").write_text(ACME_SOURCE)
    info = site / "rp_acme-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rp-acme\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[rallypoint]\nacme = rp_acme\n")
    (tmp_path / "job.toml").write_text(ACME_JOB)
    return {"PYTHONPATH": str(site)}


def test_third_party_plugin_is_listed(run_cli, acme_plugin) -> None:
    result = run_cli("plugins", "list", env=acme_plugin)

    assert result.returncode == 0
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    [row] = [i for i, line in enumerate(lines) if line.startswith("acme ")]
    assert lines[row].split()[1:] == ["rp-acme", "0.3", "rendezvous", "backend:", "acme-redis"]
    assert lines[row + 1].split() == ["rank", "strategy:", "acme-rack"]


def test_config_check_with_a_third_party_plugin(run_cli, acme_plugin) -> None:
    result = run_cli(
        "config",
        "check",
        "job.toml",
        "--set",
        "rendezvous.options.db=3",
        env={**acme_plugin, "RALLYPOINT_NODES_MAX": "4"},
    )

    assert result.returncode == 0, result.stderr
    assert result.stderr == "\njob.toml: ok\n"
    data = tomllib.loads(result.stdout)
    assert data["rendezvous"]["backend"] == "redis"
    assert data["rendezvous"]["options"] == {"url": "redis://10.0.0.7:6379", "db": 3}
    assert data["nodes"] == {"min": 2, "max": 4, "nproc_per_node": 1}
    lines = result.stdout.splitlines()
    assert 'backend = "redis"  # job.toml; acme (rp-acme 0.3)' in lines
    assert 'strategy = "acme-rack"  # job.toml; acme (rp-acme 0.3)' in lines
    assert "max = 4  # RALLYPOINT_NODES_MAX (environment)" in lines
    assert "db = 3  # --set rendezvous.options.db (command line)" in lines
    gloo = f"gloo (rallypoint-gloo {importlib.metadata.version('rallypoint-gloo')})"
    assert f'backend = "gloo"  # job.toml; {gloo}' in lines


def test_config_check_validates_the_third_party_options(run_cli, acme_plugin) -> None:
    result = run_cli("config", "check", "job.toml", env={**acme_plugin, "RALLYPOINT_RENDEZVOUS_OPTIONS_DB": "zero"})

    assert result.returncode == 2
    assert result.stderr == (
        "error: RALLYPOINT_RENDEZVOUS_OPTIONS_DB (environment): rendezvous.options.db: expected an integer, "
        "got 'zero'\n"
    )


def test_misspelled_backend_suggests_the_third_party_name(run_cli, acme_plugin, tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(ACME_JOB.replace('backend = "redis"', 'backend = "acme-rediss"'))

    result = run_cli("config", "check", "job.toml", env=acme_plugin)

    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("error: job.toml: rendezvous.backend: unknown rendezvous backend 'acme-rediss'; available: ")
    assert "acme-redis" in line
    assert line.endswith(
        "did you mean 'acme-redis'? Install plugins with pip install rallypoint-<name>; see rallypoint plugins list"
    )
