"""The ``rallypoint`` command line: the real console script in a subprocess, and ``main()`` in-process."""

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
from rallypoint.core.registry import CLI_COMMANDS

BUILTIN_NAMES = ["core", "rendezvous", "agent", "timer", "collectives", "rpc"]
MONOREPO_PLUGINS = ["etcd", "file", "gloo", "grpc", "nccl", "ranks"]
BAD_DURATION = (
    'error: job.toml: rendezvous.join_timeout: invalid duration \'ten minutes\' (write e.g. "10m" or "30s")\n'
)


def _version(dist: str) -> str:
    return importlib.metadata.version(dist)


def _installed_commands() -> str:
    """The subcommands the installed packages register, as the CLI lists them."""
    names = get_plugin_manager(environ={}).registry(CLI_COMMANDS).names()
    assert {"config", "plugins"} <= set(names)
    return ", ".join(names)


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
    # (the column width depends on the longest command name installed)
    assert re.search(r"^  config +Check a job file and show the resolved configuration\.$", result.stdout, re.M)
    assert re.search(r"^  plugins +Show installed plugins and what they register\.$", result.stdout, re.M)
    assert "RALLYPOINT_DISABLE_PLUGINS=a,b" in result.stdout
    assert "--version" in result.stdout
    assert run_cli("-h", script=True).stdout == result.stdout


def test_console_script_version(run_cli) -> None:
    result = run_cli("--version", script=True)

    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == f"rallypoint {_version('rallypoint-core')}"
    assert lines[1:] == [f"  rallypoint-{name} {_version(f'rallypoint-{name}')}" for name in BUILTIN_NAMES]


def test_plugins_list_shows_builtins_and_monorepo_plugins(run_cli) -> None:
    result = run_cli("plugins", "list", script=True)

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    header = result.stdout.splitlines()[0]
    assert header.split() == ["PLUGIN", "DISTRIBUTION", "REGISTERS"]
    rows = _rows(result.stdout)
    assert list(rows)[: len(BUILTIN_NAMES)] == BUILTIN_NAMES
    for name in BUILTIN_NAMES:
        assert rows[name].split()[:3] == [name, "*", f"rallypoint-{name}"], rows[name]
        assert f"rallypoint-{name} {_version(f'rallypoint-{name}')}" in rows[name]
    for name in MONOREPO_PLUGINS:
        assert rows[name].split()[:3] == [name, f"rallypoint-{name}", _version(f"rallypoint-{name}")], rows[name]
    assert rows["core"].endswith("CLI command: plugins, config")
    assert rows["gloo"].endswith("collective backend: gloo")
    assert rows["nccl"].endswith("collective backend: nccl")
    assert "* built-in package (registered without an entry point)" in result.stdout
    assert "failed to load" not in result.stdout


def test_plugins_list_json(run_cli) -> None:
    result = run_cli("plugins", "list", "--json", script=True)

    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["failed"] == []
    plugins = {p["name"]: p for p in data["plugins"]}
    assert set(BUILTIN_NAMES + MONOREPO_PLUGINS) <= set(plugins)
    assert plugins["core"] == {
        "name": "core",
        "distribution": "rallypoint-core",
        "version": _version("rallypoint-core"),
        "builtin": True,
        "registers": {"CLI command": ["plugins", "config"]},
    }
    assert plugins["gloo"]["builtin"] is False
    assert plugins["gloo"]["registers"] == {"collective backend": ["gloo"]}
    for name in BUILTIN_NAMES:
        assert plugins[name]["builtin"] is True


def test_disable_plugin_autoload_via_environment(run_cli) -> None:
    result = run_cli("plugins", "list", "--json", env={"RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": "1"}, script=True)

    assert result.returncode == 0
    assert [p["name"] for p in json.loads(result.stdout)["plugins"]] == BUILTIN_NAMES


def test_disable_plugins_via_environment(run_cli) -> None:
    result = run_cli("plugins", "list", env={"RALLYPOINT_DISABLE_PLUGINS": "gloo,etcd"}, script=True)

    assert result.returncode == 0
    rows = _rows(result.stdout)
    assert "gloo" not in rows
    assert "etcd" not in rows
    assert "nccl" in rows
    assert result.stdout.rstrip().endswith("disabled by RALLYPOINT_DISABLE_PLUGINS: etcd, gloo")


def test_disabling_a_builtin_package_still_lists_plugins(run_cli) -> None:
    result = run_cli("plugins", "list", env={"RALLYPOINT_DISABLE_PLUGINS": "collectives"}, script=True)

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    rows = _rows(result.stdout)
    assert "collectives" not in rows
    assert "gloo" not in rows
    assert "file" in rows
    assert "\nfailed to load:\n  plugin 'gloo' (rallypoint-gloo " in result.stdout
    assert "it implements rallypoint_collective_backends, a hook that no installed package declares" in result.stdout
    assert result.stderr.count("warning: plugin ") == 2


def test_broken_job_file_exit_2_message_on_stderr_no_traceback(run_cli, tmp_path) -> None:
    (tmp_path / "job.toml").write_text('[rendezvous]\njoin_timeout = "ten minutes"\n')

    result = run_cli("config", "check", "job.toml", script=True)

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == BAD_DURATION
    assert "Traceback" not in result.stderr


def test_invalid_toml_and_missing_file_exit_2(run_cli, tmp_path) -> None:
    (tmp_path / "job.toml").write_text("[nodes\n")

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
        f"Error: no such command 'confg'. Did you mean 'config'? Available: {_installed_commands()}. "
        "Commands come from installed packages; see rallypoint plugins list."
    )


def test_unknown_subcommand_without_a_close_match(run_cli) -> None:
    result = run_cli("launch", script=True)

    assert result.returncode == 2
    assert f"Error: no such command 'launch'. Available: {_installed_commands()}." in result.stderr


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
    assert data["rendezvous"]["backend"] == "testkv"
    assert data["rendezvous"]["options"] == {"endpoints": ["http://10.0.0.5:2379"], "retries": 3, "timeout": "5s"}
    assert data["ranks"]["strategy"] == "testranks"
    assert data["job"] == {"name": "job", "entrypoint": "train.py", "args": [], "env": {}}
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
            "nodes.max=4",
            "-s",
            "rendezvous.join_timeout=5m",
            "--set",
            'rendezvous.options.endpoints=["a", "b"]',
            "--set",
            "job.name=renamed",
        ]
    )

    out, _ = capsys.readouterr()
    assert code == 0
    lines = out.splitlines()
    assert "max = 4  # --set nodes.max (command line)" in lines
    assert 'join_timeout = "5m"  # --set rendezvous.join_timeout (command line)' in lines
    assert 'endpoints = ["a", "b"]  # --set rendezvous.options.endpoints (command line)' in lines
    assert 'name = "renamed"  # --set job.name (command line)' in lines


def test_config_check_set_wins_over_environment(job_file, acme_job, cli_with_acme, capsys, monkeypatch) -> None:
    monkeypatch.setenv("RALLYPOINT_NODES_MAX", "3")
    monkeypatch.setenv("RALLYPOINT_NODES_MIN", "2")
    file = job_file(acme_job)

    assert main(["config", "check", file, "--set", "nodes.max=5"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert "min = 2  # RALLYPOINT_NODES_MIN (environment)" in lines
    assert "max = 5  # --set nodes.max (command line)" in lines


def test_config_check_json(job_file, acme_job, cli_with_acme, capsys) -> None:
    assert main(["config", "check", job_file(acme_job), "--json"]) == 0

    data = json.loads(capsys.readouterr().out)
    assert data["rendezvous"]["backend"] == "testkv"
    assert data["plugins"]["ranks.strategy"] == {"name": "testranks", "provider": "acme", "note": None}
    assert data["agent"]["monitor_interval"] == "100ms"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("nodes.max", "error: --set (command line): nodes.max: write it as KEY=VALUE, e.g. nodes.max=4\n"),
        ("=4", "error: --set (command line): =4: write it as KEY=VALUE, e.g. nodes.max=4\n"),
        (
            "nodes.max=lots",
            "error: --set nodes.max (command line): nodes.max: expected an integer, got 'lots'\n",
        ),
        (
            "nodes.mx=4",
            "error: --set nodes.mx (command line): nodes.mx: unknown key 'mx' in [nodes]; did you mean 'max'? "
            "(known keys: max, min, nproc_per_node)\n",
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
    file = job_file(acme_job.replace('strategy = "testranks"', 'strategy = "testrank"'))

    code = main(["config", "check", file])

    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.startswith("error: job.toml: ranks.strategy: unknown rank strategy 'testrank'; available: ")
    assert "did you mean 'testranks'? Install plugins with pip install rallypoint-<name>" in err


def test_config_check_exact_bad_duration_in_process(job_file, cli_with_acme, capsys) -> None:
    code = main(["config", "check", job_file('[rendezvous]\njoin_timeout = "ten minutes"\n')])

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


class Subcommands:
    @hookimpl
    def rallypoint_cli_commands(self):
        return [
            CliCommand(name="explode", summary="Always crashes.", command=lambda: explode),
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
        from rallypoint.core.plugins import hookimpl
        from rallypoint.rendezvous.records import RendezvousBackendRecord

        @hookimpl
        def rallypoint_rendezvous_backends():
            return [RendezvousBackendRecord(name="shared", factory="x:y")]
    """
    site = tmp_path / "site"
    make_distribution(site, dist="alpha-kv", version="1.0", entry_point="alpha", source=source)
    make_distribution(site, dist="beta-kv", version="2.5", entry_point="beta", source=source)

    result = run_cli("plugins", "list", env={"PYTHONPATH": str(site)})

    assert result.returncode == 2
    assert "collective backend: gloo" in result.stdout  # the other kinds are still listed
    assert (
        "rendezvous backend 'shared' is registered twice: by alpha (alpha-kv 1.0) and by beta (beta-kv 2.5)"
        in result.stderr
    )


def test_a_misspelled_hook_in_an_installed_plugin_is_a_clear_usage_error(tmp_path, make_distribution, run_cli) -> None:
    source = """
        from rallypoint.core.plugins import hookimpl

        @hookimpl
        def rallypoint_rendezvous_backend():
            return []
    """
    site = tmp_path / "site"
    make_distribution(site, dist="typo-kv", version="0.3", entry_point="typo", source=source)

    result = run_cli("plugins", "list", env={"PYTHONPATH": str(site)})

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert (
        "error: plugin typo (typo-kv 0.3) implements 'rallypoint_rendezvous_backend', a hook that no installed "
        "package declares; did you mean 'rallypoint_rendezvous_backends'? Fix the hook name in the plugin, "
        "or disable it with RALLYPOINT_DISABLE_PLUGINS=typo"
    ) in result.stderr
