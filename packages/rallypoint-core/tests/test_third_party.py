"""Third-party plugins installed next to rallypoint, seen through the real CLI in a subprocess.

Each test writes a distribution (a module and its ``.dist-info`` with a ``rallypoint`` entry
point) into ``tmp_path`` and puts it on ``PYTHONPATH``: the same discovery as ``pip install``.
"""

from __future__ import annotations

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
    assert "\ncogs " in table  # the others still are


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
    (tmp_path / "job.toml").write_text('[widgets]\nbackend = "broken"\n')

    result = run_cli("config", "check", "job.toml", env=broken_plugin)

    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert (
        "error: job.toml: widgets.backend: plugin 'broken' (brokenplug 1.0) failed to load: ImportError: "
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
# A working third-party plugin of the widgets subsystem: a widget backend with options and a gadget maker

ACME_SOURCE = '''
"""rp-acme: a third-party plugin of the (made-up) widgets subsystem."""

from acme_widgets import GadgetMakerRecord, WidgetBackendRecord
from pydantic import BaseModel, ConfigDict

from rallypoint.core.plugins import hookimpl


class RedisOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    db: int = 0


@hookimpl
def rallypoint_widget_backends():
    return [WidgetBackendRecord(name="acme-redis", aliases=("redis",), summary="Redis streams",
                                factory="rp_acme_impl:Backend", options_model=RedisOptions)]


@hookimpl
def rallypoint_gadget_makers():
    return [GadgetMakerRecord(name="acme-rack", summary="racks first", factory="rp_acme_impl:make")]
'''

ACME_JOB = """\
[widgets]
min = 2
backend = "redis"
[widgets.options]
url = "redis://10.0.0.7:6379"

[gadgets]
maker = "acme-rack"

[inspection]
inspector = "loupe"
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
    assert lines[row].split()[1:] == ["rp-acme", "0.3", "widget", "backend:", "acme-redis"]
    assert lines[row + 1].split() == ["gadget", "maker:", "acme-rack"]


def test_config_check_with_a_third_party_plugin(run_cli, acme_plugin) -> None:
    result = run_cli(
        "config",
        "check",
        "job.toml",
        "--set",
        "widgets.options.db=3",
        env={**acme_plugin, "RALLYPOINT_WIDGETS_MAX": "4"},
    )

    assert result.returncode == 0, result.stderr
    assert result.stderr == "\njob.toml: ok\n"
    data = tomllib.loads(result.stdout)
    assert data["widgets"]["backend"] == "redis"
    assert data["widgets"]["options"] == {"url": "redis://10.0.0.7:6379", "db": 3}
    assert (data["widgets"]["min"], data["widgets"]["max"]) == (2, 4)
    lines = result.stdout.splitlines()
    assert 'backend = "redis"  # job.toml; acme (rp-acme 0.3)' in lines
    assert 'maker = "acme-rack"  # job.toml; acme (rp-acme 0.3)' in lines
    assert "max = 4  # RALLYPOINT_WIDGETS_MAX (environment)" in lines
    assert "db = 3  # --set widgets.options.db (command line)" in lines
    assert 'inspector = "loupe"  # job.toml; cogs (acme-cogs 2.0)' in lines


def test_config_check_validates_the_third_party_options(run_cli, acme_plugin) -> None:
    result = run_cli("config", "check", "job.toml", env={**acme_plugin, "RALLYPOINT_WIDGETS_OPTIONS_DB": "zero"})

    assert result.returncode == 2
    assert result.stderr == (
        "error: RALLYPOINT_WIDGETS_OPTIONS_DB (environment): widgets.options.db: expected an integer, got 'zero'\n"
    )


def test_misspelled_backend_suggests_the_third_party_name(run_cli, acme_plugin, tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(ACME_JOB.replace('backend = "redis"', 'backend = "acme-rediss"'))

    result = run_cli("config", "check", "job.toml", env=acme_plugin)

    assert result.returncode == 2
    assert result.stderr == (
        "error: job.toml: widgets.backend: unknown widget backend 'acme-rediss'; available: acme-redis, cog, plain; "
        "did you mean 'acme-redis'? Install plugins with pip install rallypoint-<name>; see rallypoint plugins list\n"
    )
