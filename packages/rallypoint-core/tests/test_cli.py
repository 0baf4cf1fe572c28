"""The ``rallypoint`` command line: the real console script in a subprocess, and ``main()`` in-process.

The subprocesses see core and the made-up widgets subsystem of ``tests/installed`` (see conftest), so
every listing below is exact.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import tomllib

import click
import pytest

from rallypoint.core.cli import main
from rallypoint.core.errors import PluginError
from rallypoint.core.plugins import get_plugin_manager, hookimpl
from rallypoint.core.records import CliCommand

CORE_VERSION = importlib.metadata.version("rallypoint-core")
BAD_DURATION = 'error: job.toml: widgets.join_timeout: invalid duration \'ten minutes\' (write e.g. "10m" or "30s")\n'
ESSENTIAL_FOOTNOTE = "* essential package (loaded even when RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD is set)"


def _rows(stdout: str) -> dict[str, str]:
    """``plugins list`` table rows by plugin name (continuation lines are skipped)."""
    rows = {}
    for line in stdout.splitlines()[1:]:
        if not line or line.startswith(" ") or line.startswith("*"):
            continue
        if line.startswith("failed to load") or line.startswith("disabled by"):
            break
        rows[line.split()[0]] = line
    return rows


# ---------------------------------------------------------------------------------------------
# The installed console script


def test_console_script_help(run_cli) -> None:
    result = run_cli("--help", script=True)

    assert result.returncode == 0
    assert result.stderr == ""
    assert result.stdout.startswith("Usage: rallypoint [OPTIONS] COMMAND [ARGS]...")
    assert re.search(r"^  config +Check a job file and show the resolved configuration\.$", result.stdout, re.M)
    assert re.search(r"^  plugins +Show installed plugins and what they register\.$", result.stdout, re.M)
    assert "RALLYPOINT_DISABLE_PLUGINS=a,b" in result.stdout
    assert "RALLYPOINT_<SECTION>_<KEY>=VALUE    override <section>.<key> of the job file" in result.stdout
    assert "--version" in result.stdout
    assert run_cli("-h", script=True).stdout == result.stdout


def test_console_script_version(run_cli) -> None:
    result = run_cli("--version", script=True)

    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        f"rallypoint {CORE_VERSION}",
        f"  rallypoint-core {CORE_VERSION}",
        "  acme-widgets 1.0",
        "  acme-cogs 2.0",
        "plugins:",
        "  cogs (acme-cogs 2.0)",
    ]


def test_plugins_list_shows_essential_packages_and_plugins(run_cli) -> None:
    result = run_cli("plugins", "list", script=True)

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    core = f"rallypoint-core {CORE_VERSION}"
    assert result.stdout.splitlines() == [
        f"PLUGIN     {'DISTRIBUTION':<{len(core)}}  REGISTERS",
        f"core *     {core}  CLI command: plugins, config, plugin",
        f"           {'':<{len(core)}}  declares kinds: CLI command",
        f"widgets *  {'acme-widgets 1.0':<{len(core)}}  widget backend: plain",
        f"           {'':<{len(core)}}  declares kinds: widget backend, gadget maker, inspector, courier, widget part",
        f"           {'':<{len(core)}}  declares sections: [widgets], [gadgets], [inspection], [delivery]",
        f"cogs       {'acme-cogs 2.0':<{len(core)}}  widget backend: cog",
        f"           {'':<{len(core)}}  gadget maker: lathe",
        f"           {'':<{len(core)}}  inspector: loupe",
        "",
        ESSENTIAL_FOOTNOTE,
    ]


def test_plugins_list_of_core_alone(run_cli, core_alone) -> None:
    result = run_cli("plugins", "list", script=True)

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["PLUGIN", "DISTRIBUTION", "REGISTERS"]
    assert lines[1].split() == [
        "core",
        "*",
        "rallypoint-core",
        CORE_VERSION,
        "CLI",
        "command:",
        "plugins,",
        "config,",
        "plugin",
    ]
    assert lines[2].split() == ["declares", "kinds:", "CLI", "command"]
    assert lines[3:] == ["", ESSENTIAL_FOOTNOTE]


def test_plugins_list_json(run_cli) -> None:
    result = run_cli("plugins", "list", "--json", script=True)

    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert (data["failed"], data["conflicts"]) == ([], [])
    plugins = {p["name"]: p for p in data["plugins"]}
    assert list(plugins) == ["core", "widgets", "cogs"]
    assert plugins["core"] == {
        "name": "core",
        "distribution": "rallypoint-core",
        "version": CORE_VERSION,
        "essential": True,
        "registers": {"CLI command": ["plugins", "config", "plugin"]},
        "declares": {"kinds": ["CLI command"], "sections": []},
    }
    assert plugins["widgets"]["essential"] is True
    assert plugins["widgets"]["declares"] == {
        "kinds": ["widget backend", "gadget maker", "inspector", "courier", "widget part"],
        "sections": ["widgets", "gadgets", "inspection", "delivery"],
    }
    assert plugins["cogs"]["essential"] is False
    assert plugins["cogs"]["registers"] == {
        "widget backend": ["cog"],
        "gadget maker": ["lathe"],
        "inspector": ["loupe"],
    }


def test_disable_plugin_autoload_via_environment(run_cli) -> None:
    result = run_cli("plugins", "list", "--json", env={"RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": "1"}, script=True)

    assert result.returncode == 0
    assert [p["name"] for p in json.loads(result.stdout)["plugins"]] == ["core", "widgets"]


def test_disable_plugins_via_environment(run_cli) -> None:
    result = run_cli("plugins", "list", env={"RALLYPOINT_DISABLE_PLUGINS": "cogs"}, script=True)

    assert result.returncode == 0
    assert list(_rows(result.stdout)) == ["core", "widgets"]
    assert result.stdout.rstrip().endswith("disabled by RALLYPOINT_DISABLE_PLUGINS: cogs")


def test_disabling_an_essential_package_still_lists_plugins(run_cli) -> None:
    result = run_cli("plugins", "list", env={"RALLYPOINT_DISABLE_PLUGINS": "widgets"}, script=True)

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert list(_rows(result.stdout)) == ["core"]
    assert "\nfailed to load:\n  plugin 'cogs' (acme-cogs 2.0) failed to load: PluginError: it implements " in (
        result.stdout
    )
    assert "a hook that no installed package declares (essential packages disabled or not loaded: widgets)" in (
        result.stdout
    )
    assert result.stderr.count("warning: plugin ") == 1


def test_broken_job_file_exit_2_message_on_stderr_no_traceback(run_cli, tmp_path) -> None:
    (tmp_path / "job.toml").write_text('[widgets]\njoin_timeout = "ten minutes"\n')

    result = run_cli("config", "check", "job.toml", script=True)

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == BAD_DURATION
    assert "Traceback" not in result.stderr


def test_a_section_of_a_package_that_is_not_installed(run_cli, tmp_path, core_alone) -> None:
    (tmp_path / "job.toml").write_text("[widgets]\nmin = 2\n")

    result = run_cli("config", "check", "job.toml", script=True)

    assert result.returncode == 2
    assert result.stderr == (
        "error: job.toml: widgets: unknown section [widgets] (known sections: none). Sections are declared by "
        "installed packages: if [widgets] belongs to one that is missing or disabled, install or enable it "
        "(see rallypoint plugins list)\n"
    )


def test_invalid_toml_and_missing_file_exit_2(run_cli, tmp_path) -> None:
    (tmp_path / "job.toml").write_text("[widgets\n")

    bad = run_cli("config", "check", "job.toml", script=True)
    missing = run_cli("config", "check", "nope.toml", script=True)

    assert bad.returncode == 2
    assert bad.stderr.startswith("error: job.toml: invalid TOML: ")
    assert missing.returncode == 2
    assert missing.stderr == "error: nope.toml: no such file; check the path\n"
    assert "Traceback" not in bad.stderr + missing.stderr


def test_unknown_subcommand_exit_2_with_suggestion(run_cli) -> None:
    result = run_cli("confg", "check", "job.toml", script=True)

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "Error: no such command 'confg'. Did you mean 'config'? Available: config, plugin, plugins. "
        "Commands come from installed packages; see rallypoint plugins list."
    )


def test_unknown_subcommand_without_a_close_match(run_cli) -> None:
    result = run_cli("launch", script=True)

    assert result.returncode == 2
    assert "Error: no such command 'launch'. Available: config, plugin, plugins." in result.stderr


def test_missing_argument_is_a_usage_error(run_cli) -> None:
    result = run_cli("config", "check", script=True)

    assert result.returncode == 2
    assert "Error: Missing argument 'JOB_FILE'." in result.stderr


def test_no_command_shows_help(run_cli) -> None:
    result = run_cli(script=True)

    assert result.returncode == 2
    assert "Usage: rallypoint [OPTIONS] COMMAND [ARGS]..." in result.stdout + result.stderr
    assert "Commands:" in result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------
# In-process: config check with test plugins


def test_config_check_prints_resolved_toml(job_file, acme_job, cli_with_acme, capsys) -> None:
    file = job_file(acme_job)

    code = main(["config", "check", file])

    out, err = capsys.readouterr()
    assert code == 0
    assert err == "\njob.toml: ok\n"
    data = tomllib.loads(out)
    assert list(data) == ["widgets", "gadgets", "inspection"]
    assert data["widgets"]["backend"] == "testkv"
    assert data["widgets"]["options"] == {"endpoints": ["http://10.0.0.5:2379"], "retries": 3, "timeout": "5s"}
    assert data["gadgets"] == {"maker": "testmaker", "timeout": "10m"}  # an empty options table is left out
    assert 'backend = "testkv"  # job.toml; acme' in out.splitlines()
    assert len(cli_with_acme) == 1  # one manager per invocation


def test_config_check_set_overrides(job_file, acme_job, cli_with_acme, capsys) -> None:
    file = job_file(acme_job)

    code = main(
        [
            "config",
            "check",
            file,
            "--set",
            "widgets.max=4",
            "-s",
            "widgets.join_timeout=5m",
            "--set",
            'widgets.options.endpoints=["a", "b"]',
            "--set",
            "widgets.name=renamed",
        ]
    )

    out, _ = capsys.readouterr()
    assert code == 0
    lines = out.splitlines()
    assert "max = 4  # --set widgets.max (command line)" in lines
    assert 'join_timeout = "5m"  # --set widgets.join_timeout (command line)' in lines
    assert 'endpoints = ["a", "b"]  # --set widgets.options.endpoints (command line)' in lines
    assert 'name = "renamed"  # --set widgets.name (command line)' in lines


def test_config_check_set_wins_over_environment(job_file, acme_job, cli_with_acme, capsys, monkeypatch) -> None:
    monkeypatch.setenv("RALLYPOINT_WIDGETS_MAX", "3")
    monkeypatch.setenv("RALLYPOINT_WIDGETS_MIN", "2")
    file = job_file(acme_job)

    assert main(["config", "check", file, "--set", "widgets.max=5"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert "min = 2  # RALLYPOINT_WIDGETS_MIN (environment)" in lines
    assert "max = 5  # --set widgets.max (command line)" in lines


def test_config_check_json(job_file, acme_job, cli_with_acme, capsys) -> None:
    assert main(["config", "check", job_file(acme_job), "--json"]) == 0

    data = json.loads(capsys.readouterr().out)
    assert data["widgets"]["backend"] == "testkv"
    assert data["plugins"]["gadgets.maker"] == {"name": "testmaker", "provider": "acme", "note": None}
    assert data["widgets"]["grace"] == "5s"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("widgets.max", "error: --set (command line): widgets.max: write it as KEY=VALUE, e.g. section.key=4\n"),
        ("=4", "error: --set (command line): =4: write it as KEY=VALUE, e.g. section.key=4\n"),
        (
            "widgets.max=lots",
            "error: --set widgets.max (command line): widgets.max: expected an integer, got 'lots'\n",
        ),
        (
            "widgets.mx=4",
            "error: --set widgets.mx (command line): widgets.mx: unknown key 'mx' in [widgets]; did you mean 'max'? "
            "(known keys: backend, env, grace, join_timeout, max, min, name, options, tags)\n",
        ),
    ],
)
def test_config_check_bad_set(job_file, acme_job, cli_with_acme, capsys, flag: str, message: str) -> None:
    code = main(["config", "check", job_file(acme_job), "--set", flag])

    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err == message


def test_config_check_phase_two_error(job_file, acme_job, cli_with_acme, capsys) -> None:
    file = job_file(acme_job.replace('maker = "testmaker"', 'maker = "testmakr"'))

    code = main(["config", "check", file])

    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err == (
        "error: job.toml: gadgets.maker: unknown gadget maker 'testmakr'; available: testmaker; did you mean "
        "'testmaker'? Install plugins with pip install rallypoint-<name>; see rallypoint plugins list\n"
    )


def test_config_check_exact_bad_duration_in_process(job_file, cli_with_acme, capsys) -> None:
    code = main(["config", "check", job_file('[widgets]\njoin_timeout = "ten minutes"\n')])

    assert code == 2
    assert capsys.readouterr() == ("", BAD_DURATION)


# ---------------------------------------------------------------------------------------------
# In-process: errors of subcommands contributed by plugins


@click.command()
def explode() -> None:
    """Fail unexpectedly."""
    raise RuntimeError("disk on fire")


@click.command()
def refuse() -> None:
    """Fail on purpose."""
    raise PluginError("the frobnicator plugin is not configured")


@click.command()
def locked() -> None:
    """Meet a directory this user may not write."""
    raise PermissionError(13, "Permission denied", "/srv/logs/attempt_0")


class Subcommands:
    @hookimpl
    def rallypoint_cli_commands(self):
        return [
            CliCommand(name="explode", summary="Always crashes.", command=lambda: explode),
            CliCommand(name="locked", summary="Meets a locked directory.", command=lambda: locked),
            CliCommand(name="refuse", aliases=("no",), summary="Always refuses.", command=lambda: refuse),
        ]


@pytest.fixture
def cli_with_subcommands(monkeypatch):
    import rallypoint.core.plugins

    monkeypatch.setattr(
        rallypoint.core.plugins,
        "get_plugin_manager",
        lambda: get_plugin_manager(plugins={"subcommands": Subcommands()}, autoload=False),
    )


def test_plugin_subcommands_are_listed_in_help(cli_with_subcommands, capsys) -> None:
    assert main(["--help"]) == 0

    out = capsys.readouterr().out
    assert re.search(r"^  explode +Always crashes\.$", out, re.M)
    assert re.search(r"^  refuse +Always refuses\.$", out, re.M)
    assert re.search(r"^  config +Check a job file", out, re.M)


def test_unexpected_error_is_an_internal_error_without_traceback(cli_with_subcommands, capsys, monkeypatch) -> None:
    monkeypatch.delenv("RALLYPOINT_DEBUG", raising=False)

    code = main(["explode"])

    _, err = capsys.readouterr()
    assert code == 1
    assert err == (
        "internal error: RuntimeError: disk on fire\n"
        "This is a bug in rallypoint or a plugin. Rerun with RALLYPOINT_DEBUG=1 for the traceback, "
        "and report it with that output.\n"
    )


def test_debug_env_shows_the_traceback(cli_with_subcommands, capsys, monkeypatch) -> None:
    monkeypatch.setenv("RALLYPOINT_DEBUG", "1")

    assert main(["explode"]) == 1

    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "RuntimeError: disk on fire" in err


def test_rallypoint_error_is_a_message_with_its_exit_code(cli_with_subcommands, capsys) -> None:
    assert main(["no"]) == 2  # by alias

    assert capsys.readouterr().err == "error: the frobnicator plugin is not configured\n"


def test_plugins_list_still_lists_everything_when_two_plugins_conflict(tmp_path, make_distribution, run_cli) -> None:
    source = """
        from acme_widgets import WidgetBackendRecord
        from rallypoint.core.plugins import hookimpl

        @hookimpl
        def rallypoint_widget_backends():
            return [WidgetBackendRecord(name="shared", factory="x:y")]
    """
    site = tmp_path / "site"
    make_distribution(site, dist="alpha-kv", version="1.0", entry_point="alpha", source=source)
    make_distribution(site, dist="beta-kv", version="2.5", entry_point="beta", source=source)

    result = run_cli("plugins", "list", env={"PYTHONPATH": str(site)})

    assert result.returncode == 2
    assert "gadget maker: lathe" in result.stdout  # the other kinds are still listed
    assert (
        "widget backend 'shared' is registered twice: by alpha (alpha-kv 1.0) and by beta (beta-kv 2.5)"
        in result.stderr
    )


TYPO_HOOK = (
    "plugin typo (typo-kv 0.3) implements 'rallypoint_widget_backend', a hook that no installed "
    "package declares; did you mean 'rallypoint_widget_backends'? Fix the hook name in the plugin, "
    "install the package that declares it, or disable the plugin with RALLYPOINT_DISABLE_PLUGINS=typo"
)


def test_a_misspelled_hook_in_an_installed_plugin_breaks_only_what_selects_it(
    tmp_path, make_distribution, run_cli
) -> None:
    """One broken third-party plugin is reported; every other command and job keeps working."""
    source = """
        from acme_widgets import WidgetBackendRecord
        from rallypoint.core.plugins import hookimpl

        @hookimpl
        def rallypoint_widget_backend():
            return [WidgetBackendRecord(name="typed", factory="x:y")]
    """
    site = tmp_path / "site"
    make_distribution(site, dist="typo-kv", version="0.3", entry_point="typo", source=source)
    env = {"PYTHONPATH": str(site)}

    listed = run_cli("plugins", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "Traceback" not in listed.stderr
    assert f"failed to load:\n  {TYPO_HOOK}\n" in listed.stdout
    assert "cogs" in listed.stdout  # the working plugins are all listed
    (tmp_path / "job.toml").write_text('[widgets]\nbackend = "plain"\n')
    ok = run_cli("config", "check", "job.toml", env=env)
    assert ok.returncode == 0, ok.stderr
    (tmp_path / "typed.toml").write_text('[widgets]\nbackend = "typed"\n')
    selected = run_cli("config", "check", "typed.toml", env=env)
    assert selected.returncode == 2
    assert f"error: typed.toml: widgets.backend: {TYPO_HOOK}\n" in selected.stderr


def test_a_plugin_that_fails_to_import_names_its_distribution_in_the_hint(tmp_path, make_distribution, run_cli) -> None:
    site = tmp_path / "site"
    make_distribution(site, dist="broken-kv", version="2.1", entry_point="brk", source="raise ImportError('no numpy')")

    listed = run_cli("plugins", "list", env={"PYTHONPATH": str(site)})

    assert listed.returncode == 0
    assert "pip install --force-reinstall broken-kv)" in listed.stdout
    assert "RALLYPOINT_DISABLE_PLUGINS=brk" in listed.stdout


def test_a_disabled_plugin_is_reported_as_disabled_when_selected(tmp_path, run_cli) -> None:
    (tmp_path / "job.toml").write_text('[widgets]\nbackend = "cogs"\n')

    result = run_cli("config", "check", "job.toml", env={"RALLYPOINT_DISABLE_PLUGINS": "cogs"})

    assert result.returncode == 2
    assert "'cogs' is provided by the plugin 'cogs', which is disabled by RALLYPOINT_DISABLE_PLUGINS" in result.stderr
    listed = run_cli("plugins", "list", "--json", env={"RALLYPOINT_DISABLE_PLUGINS": "cogs"})
    assert json.loads(listed.stdout)["disabled"] == ["cogs"]


def test_an_os_error_about_a_path_names_the_path_and_what_to_check(cli_with_subcommands, capsys, monkeypatch) -> None:
    """An unwritable directory is the user's to fix, not "a bug in rallypoint" (issue #12)."""
    monkeypatch.delenv("RALLYPOINT_DEBUG", raising=False)

    assert main(["locked"]) == 1

    err = capsys.readouterr().err
    assert err == (
        "error: /srv/logs/attempt_0: Permission denied. The system refused a file operation: check that the path "
        "is right, that this user may write there and that the disk has space (RALLYPOINT_DEBUG=1 shows where)\n"
    )
