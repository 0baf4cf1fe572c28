"""Phase 1 of job config: TOML structure, layering defaults < file < env < CLI, exact error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.core.config import JobConfig, load_job_config, parse_value
from rallypoint.core.config.loader import env_overrides
from rallypoint.core.errors import ConfigError

FULL_JOB = """\
[job]
name = "mnist"
entrypoint = "train.py"
args = ["--epochs", "3"]
env = { OMP_NUM_THREADS = "4" }

[nodes]
min = 2
max = 4
nproc_per_node = 2

[rendezvous]
backend = "etcd"
run_id = "mnist-42"
join_timeout = "10m"
last_call_timeout = "5s"
close_timeout = "30s"
heartbeat_interval = "2s"
heartbeat_timeout = "10s"
[rendezvous.options]
endpoints = ["http://10.0.0.5:2379"]

[ranks]
strategy = "topology"
[ranks.options]
order = ["rack", "host"]

[collectives]
backend = "gloo"
timeout = "60s"

[agent]
max_restarts = 3
monitor_interval = "100ms"
exit_barrier_timeout = "60s"
log_dir = "runs/{run_id}"
tee = [0, 3]

[timer]
watchdog = "file"
timeline = true

[rpc]
transport = "grpc"
serializer = "pickle"
"""


def load_error(path: str | None, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_job_config(path, **kwargs)
    assert info.value.exit_code == 2
    return info.value


# ---------------------------------------------------------------------------------------------
# Every section


def test_every_section_loads_from_toml(job_file) -> None:
    loaded = load_job_config(job_file(FULL_JOB), environ={})
    c = loaded.config

    assert loaded.path == Path("job.toml")
    assert (c.job.name, c.job.entrypoint, c.job.module) == ("mnist", "train.py", None)
    assert c.job.args == ["--epochs", "3"]
    assert c.job.env == {"OMP_NUM_THREADS": "4"}
    assert (c.nodes.min, c.nodes.max, c.nodes.max_nodes, c.nodes.nproc_per_node) == (2, 4, 4, 2)
    r = c.rendezvous
    assert (r.backend, r.run_id) == ("etcd", "mnist-42")
    assert (r.join_timeout, r.last_call_timeout, r.close_timeout) == (600.0, 5.0, 30.0)
    assert (r.heartbeat_interval, r.heartbeat_timeout) == (2.0, 10.0)
    assert r.options == {"endpoints": ["http://10.0.0.5:2379"]}
    assert (c.ranks.strategy, c.ranks.options) == ("topology", {"order": ["rack", "host"]})
    assert (c.collectives.backend, c.collectives.timeout) == ("gloo", 60.0)
    a = c.agent
    assert (a.max_restarts, a.monitor_interval, a.exit_barrier_timeout) == (3, 0.1, 60.0)
    assert (a.log_dir, a.tee) == ("runs/{run_id}", [0, 3])
    assert (c.timer.watchdog, c.timer.timeline) == ("file", True)
    assert c.rpc is not None
    assert (c.rpc.transport, c.rpc.serializer) == ("grpc", "pickle")
    assert loaded.source_of("agent.tee") == "job.toml"


def test_defaults() -> None:
    loaded = load_job_config(None, environ={})
    c = loaded.config

    assert loaded.path is None
    assert c.job.name is None
    assert (c.nodes.min, c.nodes.max, c.nodes.max_nodes, c.nodes.nproc_per_node) == (1, None, 1, 1)
    assert c.rendezvous.backend == "memory"
    assert c.rendezvous.join_timeout == 600.0
    assert c.ranks.strategy == "default"
    assert c.collectives.backend == "auto"
    assert c.agent.max_restarts == 3
    assert c.agent.tee == "all"
    assert c.timer.watchdog == "off"
    assert c.timer.timeline is False
    assert c.rpc is None
    assert loaded.sources == {}
    assert loaded.source_of("nodes.min") == "default"


def test_job_name_defaults_to_the_file_stem(job_file) -> None:
    loaded = load_job_config(job_file('[job]\nmodule = "pkg.train"\n', name="resnet50.toml"), environ={})

    assert loaded.config.job.name == "resnet50"
    assert loaded.config.job.module == "pkg.train"


@pytest.mark.parametrize(("value", "expected"), [('"auto"', "auto"), ("8", 8), ('"3"', 3)])
def test_nproc_per_node_forms(job_file, value: str, expected: object) -> None:
    loaded = load_job_config(job_file(f"[nodes]\nnproc_per_node = {value}\n"), environ={})

    assert loaded.config.nodes.nproc_per_node == expected


@pytest.mark.parametrize(
    ("value", "expected"), [('"all"', "all"), ('"rank0"', "rank0"), ('"none"', "none"), ("[1]", [1])]
)
def test_tee_forms(job_file, value: str, expected: object) -> None:
    assert load_job_config(job_file(f"[agent]\ntee = {value}\n"), environ={}).config.agent.tee == expected


@pytest.mark.parametrize(("value", "seconds"), [('"250ms"', 0.25), ('"1h30m"', 5400.0), ("45", 45.0), ("0.5", 0.5)])
def test_durations_in_the_file(job_file, value: str, seconds: float) -> None:
    loaded = load_job_config(job_file(f"[collectives]\ntimeout = {value}\n"), environ={})

    assert loaded.config.collectives.timeout == seconds


# ---------------------------------------------------------------------------------------------
# Layering


LAYERED = """\
[nodes]
min = 1
max = 2

[rendezvous]
join_timeout = "1m"
close_timeout = "45s"
"""


def test_layering_defaults_file_env_cli(job_file) -> None:
    environ = {
        "RALLYPOINT_NODES_MAX": "3",
        "RALLYPOINT_RENDEZVOUS_JOIN_TIMEOUT": "5m",
        "RALLYPOINT_RENDEZVOUS_RUN_ID": "from-env",
        "RALLYPOINT_DISABLE_PLUGINS": "gloo",  # a control, not configuration
        "RALLYPOINT_DEBUG": "1",
        "UNRELATED": "x",
    }
    overrides = [("nodes.max", 4, "--set nodes.max (command line)")]

    loaded = load_job_config(job_file(LAYERED), environ=environ, overrides=overrides)
    c = loaded.config

    assert c.nodes.max == 4
    assert loaded.source_of("nodes.max") == "--set nodes.max (command line)"
    assert c.rendezvous.join_timeout == 300.0
    assert loaded.source_of("rendezvous.join_timeout") == "RALLYPOINT_RENDEZVOUS_JOIN_TIMEOUT (environment)"
    assert c.rendezvous.run_id == "from-env"
    assert loaded.source_of("rendezvous.run_id") == "RALLYPOINT_RENDEZVOUS_RUN_ID (environment)"
    assert c.rendezvous.close_timeout == 45.0
    assert loaded.source_of("rendezvous.close_timeout") == "job.toml"
    assert c.nodes.min == 1
    assert loaded.source_of("nodes.min") == "job.toml"
    assert c.agent.max_restarts == 3
    assert loaded.source_of("agent.max_restarts") == "default"
    assert loaded.source_of("rendezvous.heartbeat_timeout", inherit=False) == "default"
    assert loaded.is_explicit("rendezvous")
    assert not loaded.is_explicit("agent")


def test_environment_defaults_to_os_environ(job_file, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RALLYPOINT_NODES_MAX", "7")

    loaded = load_job_config(job_file(LAYERED))

    assert loaded.config.nodes.max == 7
    assert loaded.source_of("nodes.max") == "RALLYPOINT_NODES_MAX (environment)"


def test_env_values_are_read_as_toml_values(job_file) -> None:
    environ = {
        "RALLYPOINT_JOB_ARGS": '["--lr", "0.1"]',
        "RALLYPOINT_TIMER_TIMELINE": "true",
        "RALLYPOINT_NODES_NPROC_PER_NODE": "auto",
        "RALLYPOINT_AGENT_TEE": "[0, 2]",
        "RALLYPOINT_JOB_ENTRYPOINT": "train.py",
    }

    c = load_job_config(None, environ=environ).config

    assert c.job.args == ["--lr", "0.1"]
    assert c.timer.timeline is True
    assert c.nodes.nproc_per_node == "auto"
    assert c.agent.tee == [0, 2]
    assert c.job.entrypoint == "train.py"


def test_env_sets_plugin_options(job_file) -> None:
    file = job_file('[rendezvous]\nbackend = "etcd"\n[rendezvous.options]\nendpoints = ["a"]\nprefix = "/rp"\n')
    environ = {"RALLYPOINT_RENDEZVOUS_OPTIONS_ENDPOINTS": '["b", "c"]', "RALLYPOINT_RANKS_OPTIONS_ORDER_BY": "rack"}

    loaded = load_job_config(file, environ=environ)

    assert loaded.config.rendezvous.options == {"endpoints": ["b", "c"], "prefix": "/rp"}
    assert loaded.config.ranks.options == {"order_by": "rack"}
    assert loaded.source_of("rendezvous.options.endpoints") == "RALLYPOINT_RENDEZVOUS_OPTIONS_ENDPOINTS (environment)"
    assert loaded.source_of("rendezvous.options.prefix") == "job.toml"


def test_env_overrides_parsing() -> None:
    assert env_overrides(
        {
            "RALLYPOINT_NODES_MAX": "4",
            "RALLYPOINT_DISABLE_PLUGINS": "x",
            "RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": "1",
            "RALLYPOINT_NODES": "3",
            "RALLYPOINT_RPC_OPTIONS_TOKEN_FILE": "/run/token",
            "rallypoint_nodes_min": "2",
        }
    ) == [
        ("nodes.max", 4, "RALLYPOINT_NODES_MAX (environment)"),
        ("rpc.options.token_file", "/run/token", "RALLYPOINT_RPC_OPTIONS_TOKEN_FILE (environment)"),
    ]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4", 4),
        ("2.5", 2.5),
        ("true", True),
        ("5m", "5m"),
        ("etcd", "etcd"),
        ('"quoted"', "quoted"),
        ('["a", "b"]', ["a", "b"]),
        ("{ x = 1 }", {"x": 1}),
        ("", ""),
    ],
)
def test_parse_value(text: str, value: object) -> None:
    assert parse_value(text) == value


def test_override_replacing_a_table_forgets_where_the_old_keys_came_from(job_file) -> None:
    file = job_file('[rendezvous.options]\nendpoints = ["a"]\nprefix = "/rp"\n')
    overrides = [("rendezvous.options", {"endpoints": ["z"]}, "--set rendezvous.options (command line)")]

    loaded = load_job_config(file, environ={}, overrides=overrides)

    assert loaded.config.rendezvous.options == {"endpoints": ["z"]}
    assert loaded.source_of("rendezvous.options.endpoints", inherit=False) == "--set rendezvous.options (command line)"
    assert loaded.source_of("rendezvous.options.prefix", inherit=False) == "default"


def test_source_of_list_items_and_enclosing_keys(job_file) -> None:
    file = job_file('[job]\nname = "x"\nargs = ["a"]\n')
    loaded = load_job_config(file, environ={"RALLYPOINT_RENDEZVOUS_OPTIONS_ENDPOINTS": '["a", "b"]'})

    assert loaded.source_of("job.args[0]") == "job.toml"
    assert (
        loaded.source_of("rendezvous.options.endpoints[1]") == "RALLYPOINT_RENDEZVOUS_OPTIONS_ENDPOINTS (environment)"
    )
    assert loaded.source_of("job.env") == "job.toml"  # errors are located in the enclosing table
    assert loaded.source_of("job.env", inherit=False) == "default"  # but the value is a default


# ---------------------------------------------------------------------------------------------
# Errors, with their exact messages


def test_bad_duration_message_is_exact(job_file) -> None:
    error = load_error(job_file('[rendezvous]\njoin_timeout = "ten minutes"\n'), environ={})

    assert str(error) == (
        'job.toml: rendezvous.join_timeout: invalid duration \'ten minutes\' (write e.g. "10m" or "30s")'
    )
    [issue] = error.issues
    assert (issue.source, issue.key) == ("job.toml", "rendezvous.join_timeout")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "[nodes]\nmni = 2\n",
            "job.toml: nodes.mni: unknown key 'mni' in [nodes]; did you mean 'min'? "
            "(known keys: max, min, nproc_per_node)",
        ),
        (
            '[rendezvous]\njoin_timout = "5m"\n',
            "job.toml: rendezvous.join_timout: unknown key 'join_timout' in [rendezvous]; did you mean "
            "'join_timeout'? (known keys: backend, close_timeout, heartbeat_interval, heartbeat_timeout, "
            "join_timeout, last_call_timeout, options, run_id)",
        ),
        (
            '[jobs]\nname = "x"\n',
            "job.toml: jobs: unknown key 'jobs'; did you mean 'job'? "
            "(known keys: agent, collectives, job, nodes, ranks, rendezvous, rpc, timer)",
        ),
        (
            "[agent]\ncolour = true\n",
            "job.toml: agent.colour: unknown key 'colour' in [agent] (known keys: exit_barrier_timeout, "
            "log_dir, max_restarts, monitor_interval, store_head_start, tee)",
        ),
        ('[nodes]\nmax = "four"\n', "job.toml: nodes.max: expected an integer, got 'four'"),
        ("[nodes]\nmin = 2.5\n", "job.toml: nodes.min: expected an integer, got 2.5"),
        ("[job]\nname = 3\n", "job.toml: job.name: expected a string, got 3"),
        ('[job]\nargs = "--epochs 3"\n', "job.toml: job.args: expected a list, got '--epochs 3'"),
        ('[job]\nargs = ["a", 3]\n', "job.toml: job.args[1]: expected a string, got 3"),
        ("[timer]\ntimeline = 3\n", "job.toml: timer.timeline: expected true or false, got 3"),
        ("nodes = 3\n", "job.toml: nodes: expected a table, got 3"),
        ("[rendezvous]\noptions = [1]\n", "job.toml: rendezvous.options: expected a table, got a list"),
        ("[agent]\nmax_restarts = -1\n", "job.toml: agent.max_restarts: must be at least 0, got -1"),
        ("[nodes]\nmin = 0\n", "job.toml: nodes.min: must be at least 1, got 0"),
        ('[rendezvous]\njoin_timeout = "0s"\n', "job.toml: rendezvous.join_timeout: must be greater than 0, got '0s'"),
        (
            "[rendezvous]\nclose_timeout = -3\n",
            "job.toml: rendezvous.close_timeout: invalid duration -3: must be a finite, non-negative time "
            '(write e.g. "10m" or "30s")',
        ),
        ('[rpc]\nserializer = "json"\n', "job.toml: rpc.serializer: expected 'safe' or 'pickle', got 'json'"),
        ("[nodes]\nmin = 3\nmax = 2\n", "job.toml: nodes: max (2) is smaller than min (3)"),
        (
            '[rendezvous]\nheartbeat_interval = "20s"\n',
            "job.toml: rendezvous: heartbeat_timeout (10s) must be longer than heartbeat_interval (20s)",
        ),
        (
            '[job]\nentrypoint = "a.py"\nmodule = "a"\n',
            "job.toml: job: set either entrypoint or module, not both (module runs as python -m)",
        ),
        (
            "[nodes]\nnproc_per_node = 0\n",
            'job.toml: nodes.nproc_per_node: expected a positive number of workers or "auto", got 0',
        ),
        (
            '[agent]\ntee = "rank1"\n',
            'job.toml: agent.tee: expected "all", "rank0", "none" or a list of ranks such as [0, 3], got \'rank1\'',
        ),
    ],
)
def test_structure_errors(job_file, toml: str, message: str) -> None:
    assert str(load_error(job_file(toml), environ={})) == message


def test_every_problem_is_reported_not_only_the_first(job_file) -> None:
    error = load_error(job_file('[nodes]\nmax = "four"\nmni = 2\n[timer]\nwatchdg = "file"\n'), environ={})

    assert [(i.source, i.key) for i in error.issues] == [
        ("job.toml", "nodes.max"),
        ("job.toml", "nodes.mni"),
        ("job.toml", "timer.watchdg"),
    ]
    assert str(error).count("\n") == 2


def test_errors_name_the_env_var_that_set_the_value(job_file) -> None:
    file = job_file('[job]\nname = "x"\n[nodes]\nmin = 1\n')
    environ = {"RALLYPOINT_NODES_MAX": "lots", "RALLYPOINT_JOB_ARGS": '["a", 3]', "RALLYPOINT_NODES_MAXX": "3"}

    error = load_error(file, environ=environ)

    assert [str(i) for i in error.issues] == [
        "RALLYPOINT_JOB_ARGS (environment): job.args[1]: expected a string, got 3",
        "RALLYPOINT_NODES_MAX (environment): nodes.max: expected an integer, got 'lots'",
        "RALLYPOINT_NODES_MAXX (environment): nodes.maxx: unknown key 'maxx' in [nodes]; did you mean 'max'? "
        "(known keys: max, min, nproc_per_node)",
    ]


def test_errors_name_the_cli_flag_that_set_the_value(job_file) -> None:
    overrides = [("rendezvous.last_call_timeout", "soon", "--set rendezvous.last_call_timeout (command line)")]

    error = load_error(job_file(LAYERED), environ={}, overrides=overrides)

    assert str(error) == (
        "--set rendezvous.last_call_timeout (command line): rendezvous.last_call_timeout: "
        'invalid duration \'soon\' (write e.g. "10m" or "30s")'
    )


def test_invalid_toml(job_file) -> None:
    error = load_error(job_file("[nodes\nmin = 1\n"), environ={})

    assert str(error) == "job.toml: invalid TOML: Expected ']' at the end of a table declaration (at line 1, column 7)"


def test_duplicate_key_is_invalid_toml(job_file) -> None:
    error = load_error(job_file("[nodes]\nmin = 1\nmin = 2\n"), environ={})

    assert str(error).startswith("job.toml: invalid TOML: ")


def test_missing_file(job_file) -> None:
    job_file("")  # chdir into tmp_path

    assert str(load_error("missing.toml", environ={})) == "missing.toml: no such file; check the path"


def test_directory_instead_of_file(tmp_path: Path, job_file) -> None:
    job_file("")
    (tmp_path / "jobs").mkdir()

    assert str(load_error("jobs", environ={})) == "jobs: is a directory; give the path of a .toml job file"


def test_file_that_is_not_utf8(tmp_path: Path, job_file) -> None:
    job_file("")
    (tmp_path / "latin1.toml").write_bytes('[job]\nname = "caf\xe9"\n'.encode("latin-1"))

    assert str(load_error("latin1.toml", environ={})) == "latin1.toml: is not UTF-8 text; a job file is TOML"


def test_absolute_path_is_named_as_given(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("[nodes]\nmin = -1\n")

    assert str(load_error(str(path), environ={})) == f"{path}: nodes.min: must be at least 1, got -1"


def test_job_config_model_forbids_extra_keys_in_plain_python() -> None:
    assert JobConfig.model_validate({"nodes": {"min": 2, "max": 4}}).nodes.max_nodes == 4
    with pytest.raises(ValueError, match="extra"):
        JobConfig.model_validate({"nodes": {"mn": 2}})


def test_values_are_not_coerced_from_strings(job_file) -> None:
    path = job_file(
        """
        [nodes]
        max = "4"

        [timer]
        timeline = "yes"
        """
    )
    with pytest.raises(ConfigError) as info:
        load_job_config(path, environ={})
    assert [str(i) for i in info.value.issues] == [
        "job.toml: nodes.max: expected an integer, got '4'",
        "job.toml: timer.timeline: expected true or false, got 'yes'",
    ]
