"""Phase 2 of job config: plugin selections looked up, plugin options validated; rendering."""

from __future__ import annotations

import json
import tomllib

import pytest

from rallypoint.core.config import load_job_config, render_resolved, resolve_config
from rallypoint.core.config.render import resolved_as_dict, toml_value
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import PluginLoadWarning, get_plugin_manager, hookimpl
from rallypoint.core.registry import COLLECTIVE_BACKENDS, RANK_STRATEGIES, RENDEZVOUS_BACKENDS
from rallypoint.rendezvous.records import RendezvousBackendRecord

HINT = "Install plugins with pip install rallypoint-<name>; see rallypoint plugins list"


def resolve_error(path: str, pm, environ=None) -> ConfigError:
    loaded = load_job_config(path, environ=environ or {})
    with pytest.raises(ConfigError) as info:
        resolve_config(loaded, pm)
    assert info.value.exit_code == 2
    return info.value


def test_every_selection_resolves_to_its_record_and_provider(job_file, acme_pm, acme_job) -> None:
    text = acme_job + '\n[timer]\nwatchdog = "testtimer"\n\n[rpc]\ntransport = "testrpc"\n'
    loaded = load_job_config(job_file(text), environ={})

    resolved = resolve_config(loaded, acme_pm)

    assert list(resolved.selections) == [
        "rendezvous.backend",
        "ranks.strategy",
        "collectives.backend",
        "timer.watchdog",
        "rpc.transport",
    ]
    for key, name in [
        ("rendezvous.backend", "testkv"),
        ("ranks.strategy", "testranks"),
        ("collectives.backend", "testcoll"),
        ("timer.watchdog", "testtimer"),
        ("rpc.transport", "testrpc"),
    ]:
        selection = resolved.selections[key]
        assert selection.name == name
        assert selection.record is not None
        assert selection.record.name == name
        assert selection.provider is not None
        assert selection.provider.name == "acme"
    options = resolved.selections["rendezvous.backend"].options
    assert options is not None
    assert options.model_dump() == {"endpoints": ["http://10.0.0.5:2379"], "retries": 3, "timeout": 5.0}
    assert resolved.selections["ranks.strategy"].options is None
    assert resolved.config is loaded.config


def test_alias_selects_the_record(job_file, acme_pm, acme_job) -> None:
    loaded = load_job_config(job_file(acme_job.replace('backend = "testkv"', 'backend = "TKV"')), environ={})

    selection = resolve_config(loaded, acme_pm).selections["rendezvous.backend"]

    assert selection.name == "TKV"
    assert selection.record is not None
    assert selection.record.name == "testkv"


def test_auto_collectives_and_watchdog_off_are_not_plugin_names(job_file, acme_pm, acme_job) -> None:
    text = acme_job.replace('backend = "testcoll"', 'backend = "auto"')
    loaded = load_job_config(job_file(text), environ={})

    resolved = resolve_config(loaded, acme_pm)

    auto = resolved.selections["collectives.backend"]
    assert auto.record is None
    names = acme_pm.registry(COLLECTIVE_BACKENDS).names()
    assert "testcoll" in names
    assert auto.note == f"picked at run time among: {', '.join(names)}"
    off = resolved.selections["timer.watchdog"]
    assert (off.name, off.record, off.note) == ("off", None, "disabled")


def test_auto_with_no_collective_backend_installed(job_file) -> None:
    class Minimal:
        @hookimpl
        def rallypoint_rendezvous_backends(self):
            return [RendezvousBackendRecord(name="testkv", factory="x:y")]

    pm = get_plugin_manager(plugins={"minimal": Minimal()}, autoload=False)
    assert pm.registry(COLLECTIVE_BACKENDS).names() == []  # nothing built in registers one
    file = job_file('[rendezvous]\nbackend = "testkv"\n[collectives]\nbackend = "auto"\n')

    error = resolve_error(file, pm)

    assert (
        "job.toml: collectives.backend: 'auto' needs at least one collective backend, and none is installed; "
        "pip install rallypoint-gloo"
    ) in str(error).splitlines()


def test_rpc_is_resolved_only_when_the_job_has_an_rpc_section(job_file, acme_pm, acme_job) -> None:
    resolved = resolve_config(load_job_config(job_file(acme_job), environ={}), acme_pm)
    assert "rpc.transport" not in resolved.selections

    with_rpc = job_file(acme_job + "\n[rpc]\n", name="rpc.toml")
    error = resolve_error(with_rpc, acme_pm)
    assert str(error) == f"rpc.toml: rpc.transport: unknown RPC transport 'grpc'; available: testrpc. {HINT}"


def test_unknown_backend_with_did_you_mean(job_file, acme_pm, acme_job) -> None:
    file = job_file(acme_job.replace('backend = "testkv"', 'backend = "testkb"'))

    error = resolve_error(file, acme_pm)

    available = ", ".join(acme_pm.registry(RENDEZVOUS_BACKENDS).names())
    assert "needy" in available
    assert "testkv" in available
    assert str(error) == (
        f"job.toml: rendezvous.backend: unknown rendezvous backend 'testkb'; available: {available}; "
        f"did you mean 'testkv'? {HINT}"
    )


def test_unknown_names_from_env_are_attributed_to_the_variable(job_file, acme_pm, acme_job) -> None:
    error = resolve_error(job_file(acme_job), acme_pm, environ={"RALLYPOINT_RANKS_STRATEGY": "zigzag"})

    [issue] = error.issues
    assert issue.source == "RALLYPOINT_RANKS_STRATEGY (environment)"
    assert issue.key == "ranks.strategy"
    assert issue.message.startswith("unknown rank strategy 'zigzag'; available: ")
    assert "testranks" in issue.message
    assert issue.message.endswith(HINT)


def test_bad_plugin_options_are_validated_by_the_plugins_model(job_file, acme_pm, acme_job) -> None:
    text = acme_job.replace(
        'endpoints = ["http://10.0.0.5:2379"]',
        'endpoints = ["http://10.0.0.5:2379", 2380]\nretrys = 2\nretries = -1\ntimeout = "forever"',
    )

    error = resolve_error(job_file(text), acme_pm)

    assert str(error).splitlines() == [
        "job.toml: rendezvous.options.endpoints[1]: expected a string, got 2380",
        "job.toml: rendezvous.options.retries: must be at least 0, got -1",
        'job.toml: rendezvous.options.timeout: invalid duration \'forever\' (write e.g. "10m" or "30s")',
        "job.toml: rendezvous.options.retrys: unknown key 'retrys'; did you mean 'retries'? "
        "(known keys: endpoints, retries, timeout)",
    ]


def test_missing_required_option(job_file, acme_pm, acme_job) -> None:
    text = acme_job.replace('endpoints = ["http://10.0.0.5:2379"]', "retries = 1")

    error = resolve_error(job_file(text), acme_pm)

    assert str(error) == "job.toml: rendezvous.options.endpoints: required key is missing"


def test_plugin_option_error_from_env_names_the_variable(job_file, acme_pm, acme_job) -> None:
    environ = {"RALLYPOINT_RENDEZVOUS_OPTIONS_ENDPOINTS": '["ok", 3]'}

    error = resolve_error(job_file(acme_job), acme_pm, environ=environ)

    assert str(error) == (
        "RALLYPOINT_RENDEZVOUS_OPTIONS_ENDPOINTS (environment): rendezvous.options.endpoints[1]: "
        "expected a string, got 3"
    )


def test_options_given_to_a_plugin_that_takes_none(job_file, acme_pm, acme_job) -> None:
    text = acme_job.replace('strategy = "testranks"', 'strategy = "testranks"\n[ranks.options]\nzeta = 1\nalpha = 2')

    error = resolve_error(job_file(text), acme_pm)

    assert str(error) == "job.toml: ranks.options: rank strategy 'testranks' takes no options; remove alpha, zeta"


def test_missing_requirement_names_the_pip_install(job_file, acme_pm, acme_job) -> None:
    text = acme_job.replace('backend = "testkv"', 'backend = "needy"').replace(
        '[rendezvous.options]\nendpoints = ["http://10.0.0.5:2379"]\n', ""
    )

    error = resolve_error(job_file(text), acme_pm)

    assert str(error) == (
        "job.toml: rendezvous.backend: rendezvous backend 'needy' needs the Python module "
        "'surely_not_installed_mod', which is not installed. Install it with: pip install x"
    )


def test_all_phase_two_problems_are_reported_together(job_file, acme_pm, acme_job) -> None:
    text = (
        acme_job.replace('backend = "testkv"', 'backend = "needy"')
        .replace('strategy = "testranks"', 'strategy = "testrank"')
        .replace('backend = "testcoll"', 'backend = "testcol"')
    )

    error = resolve_error(job_file(text), acme_pm)

    assert [i.key for i in error.issues] == [
        "rendezvous.backend",
        "rendezvous.options",
        "ranks.strategy",
        "collectives.backend",
    ]
    assert "did you mean 'testranks'?" in error.issues[2].message
    assert "did you mean 'testcoll'?" in error.issues[3].message


def test_selecting_a_plugin_that_failed_to_load_explains_why(job_file, acme_job, acme_plugin) -> None:
    class Broken:
        @hookimpl
        def rallypoint_rank_strategies(self):
            raise ImportError("needs numpy")

    pm = get_plugin_manager(plugins={"acme": acme_plugin, "fancyranks": Broken()}, autoload=False)
    with pytest.warns(PluginLoadWarning, match="plugin 'fancyranks'"):
        pm.registry(RANK_STRATEGIES)  # calling the hook is what fails
    file = job_file(acme_job.replace('strategy = "testranks"', 'strategy = "fancyranks"'))

    error = resolve_error(file, pm)

    assert str(error) == (
        "job.toml: ranks.strategy: plugin 'fancyranks' (fancyranks) failed to load: ImportError: needs numpy. "
        "Reinstall it (pip install --force-reinstall fancyranks), or disable it with "
        "RALLYPOINT_DISABLE_PLUGINS=fancyranks"
    )


# ---------------------------------------------------------------------------------------------
# Subsystem not installed


def test_subsystem_absent_is_fine_until_the_job_selects_something_of_it(job_file) -> None:
    # Without the rendezvous, agent and collectives packages (disabled here), a job that keeps the
    # defaults checks fine; naming a backend explicitly says which package to install.
    pm = get_plugin_manager(autoload=False, disabled=["rendezvous", "agent", "collectives"])
    loaded = load_job_config(job_file('[job]\nentrypoint = "train.py"\n'), environ={})

    resolved = resolve_config(loaded, pm)

    assert resolved.selections["rendezvous.backend"].note == "rallypoint-rendezvous not installed"
    assert resolved.selections["ranks.strategy"].note == "rallypoint-agent not installed"
    assert resolved.selections["collectives.backend"].note == "rallypoint-collectives not installed"

    explicit = load_job_config(
        job_file('[rendezvous]\nbackend = "etcd"\n[collectives]\nbackend = "auto"\n', name="explicit.toml"), environ={}
    )
    with pytest.raises(ConfigError) as info:
        resolve_config(explicit, pm)
    assert str(info.value).splitlines() == [
        "explicit.toml: rendezvous.backend: rendezvous backend 'etcd' needs rallypoint-rendezvous, which is not "
        "installed; pip install rallypoint-rendezvous",
        "explicit.toml: collectives.backend: 'auto' needs at least one collective backend, and none is installed; "
        "pip install rallypoint-gloo",
    ]


# ---------------------------------------------------------------------------------------------
# Rendering


def test_render_shows_each_value_with_its_source(job_file, acme_pm, acme_job) -> None:
    loaded = load_job_config(
        job_file(acme_job),
        environ={"RALLYPOINT_NODES_MAX": "4"},
        overrides=[("rendezvous.join_timeout", "5m", "--set rendezvous.join_timeout (command line)")],
    )

    text = render_resolved(resolve_config(loaded, acme_pm))
    lines = text.splitlines()

    assert 'entrypoint = "train.py"  # job.toml' in lines
    assert "args = []  # default" in lines
    assert "max = 4  # RALLYPOINT_NODES_MAX (environment)" in lines
    assert "min = 1  # default" in lines
    assert 'backend = "testkv"  # job.toml; acme' in lines
    assert 'join_timeout = "5m"  # --set rendezvous.join_timeout (command line)' in lines
    assert 'close_timeout = "30s"  # default' in lines  # [rendezvous] is in the file, this key is not
    assert "[rendezvous.options]" in lines
    assert 'endpoints = ["http://10.0.0.5:2379"]  # job.toml' in lines
    assert "retries = 3  # default" in lines
    assert 'strategy = "testranks"  # job.toml; acme' in lines
    assert 'backend = "testcoll"  # job.toml; acme' in lines
    assert 'watchdog = "off"  # default; disabled' in lines
    assert "[rpc]" not in lines
    assert text.endswith("\n")


def test_rendered_toml_loads_back_to_the_same_job(job_file, acme_pm, acme_job, tmp_path) -> None:
    text = acme_job + '\n[agent]\ntee = [0, 3]\nmonitor_interval = "250ms"\n\n[job.env]\n"WEIRD KEY" = "v"\n'
    loaded = load_job_config(job_file(text), environ={})
    rendered = render_resolved(resolve_config(loaded, acme_pm))

    (tmp_path / "again.toml").write_text(rendered)
    again = load_job_config("again.toml", environ={})

    assert tomllib.loads(rendered)["agent"]["monitor_interval"] == "250ms"
    # the same job, except that the rendered options carry the plugin's defaults
    skip = {"rendezvous": {"options"}}
    assert again.config.model_dump(exclude=skip) == loaded.config.model_dump(exclude=skip)
    assert again.config.job.name == "job"  # the name derived from job.toml is written out
    assert again.config.job.env == {"WEIRD KEY": "v"}
    assert again.config.rendezvous.options == {"endpoints": ["http://10.0.0.5:2379"], "retries": 3, "timeout": "5s"}
    assert resolve_config(again, acme_pm).selections["rendezvous.backend"].options == (
        resolve_config(loaded, acme_pm).selections["rendezvous.backend"].options
    )


def test_resolved_as_dict_is_json_with_plugins(job_file, acme_pm, acme_job) -> None:
    loaded = load_job_config(job_file(acme_job), environ={})

    data = resolved_as_dict(resolve_config(loaded, acme_pm))

    json.dumps(data)  # plain data
    assert data["rendezvous"]["join_timeout"] == "10m"
    assert data["rendezvous"]["options"] == {"endpoints": ["http://10.0.0.5:2379"], "retries": 3, "timeout": "5s"}
    assert data["plugins"]["rendezvous.backend"] == {"name": "testkv", "provider": "acme", "note": None}
    assert data["plugins"]["timer.watchdog"] == {"name": "off", "provider": None, "note": "disabled"}
    assert "rpc" not in data


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (3, "3"),
        (2.5, "2.5"),
        ('a"b', '"a\\"b"'),
        (["a", 1], '["a", 1]'),
        ({}, "{}"),
        ({"x": 1, "two words": "y"}, '{ x = 1, "two words" = "y" }'),
    ],
)
def test_toml_value(value: object, text: str) -> None:
    assert toml_value(value) == text
    assert tomllib.loads(f"v = {text}")["v"] == value
