"""The ``[rendezvous]`` section this package declares: loading, layering, exact errors (moved from core)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rallypoint.core.config import build_schema, load_job_config
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import get_plugin_manager
from rallypoint.rendezvous.config import RENDEZVOUS_SECTION, RendezvousSection
from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

SCHEMA = build_schema([RENDEZVOUS_SECTION])

SECTION = """\
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
"""

LAYERED = """\
[rendezvous]
join_timeout = "1m"
close_timeout = "45s"
"""


@pytest.fixture
def job_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)

    def write(text: str, name: str = "job.toml") -> str:
        (tmp_path / name).write_text(textwrap.dedent(text))
        return name

    return write


def load_error(path: str, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_job_config(path, SCHEMA, **kwargs)
    assert info.value.exit_code == 2
    return info.value


def test_the_package_declares_its_kind_and_section() -> None:
    pm = get_plugin_manager(autoload=False)

    assert pm.kind("rallypoint_rendezvous_backends") is RENDEZVOUS_BACKENDS
    assert RENDEZVOUS_BACKENDS.config_key == "rendezvous.backend"
    assert RENDEZVOUS_SECTION in pm.sections()
    assert pm.declared_by["config section rendezvous"] == "rendezvous"
    assert pm.infos["rendezvous"].essential is True
    assert "memory" in pm.registry(RENDEZVOUS_BACKENDS)


def test_the_section_loads_from_toml(job_file) -> None:
    r = load_job_config(job_file(SECTION), SCHEMA, environ={}).section(RendezvousSection)

    assert (r.backend, r.run_id) == ("etcd", "mnist-42")
    assert (r.join_timeout, r.last_call_timeout, r.close_timeout) == (600.0, 5.0, 30.0)
    assert (r.heartbeat_interval, r.heartbeat_timeout) == (2.0, 10.0)
    assert r.options == {"endpoints": ["http://10.0.0.5:2379"]}


def test_defaults_are_the_timeouts_defaults() -> None:
    r = load_job_config(None, SCHEMA, environ={}).config.rendezvous
    defaults = RendezvousTimeouts()

    assert (r.backend, r.run_id, r.options) == ("memory", None, {})
    assert (r.join_timeout, r.last_call_timeout, r.close_timeout) == (defaults.join, defaults.last_call, defaults.close)
    assert (r.heartbeat_interval, r.heartbeat_timeout) == (defaults.heartbeat_interval, defaults.heartbeat_timeout)
    assert r.join_timeout == 600.0


def test_layering_file_env_cli(job_file) -> None:
    environ = {"RALLYPOINT_RENDEZVOUS_JOIN_TIMEOUT": "5m", "RALLYPOINT_RENDEZVOUS_RUN_ID": "from-env"}
    overrides = [("rendezvous.backend", "file", "--rdzv-backend (command line)")]

    loaded = load_job_config(job_file(LAYERED), SCHEMA, environ=environ, overrides=overrides)
    r = loaded.config.rendezvous

    assert r.join_timeout == 300.0
    assert loaded.source_of("rendezvous.join_timeout") == "RALLYPOINT_RENDEZVOUS_JOIN_TIMEOUT (environment)"
    assert r.run_id == "from-env"
    assert loaded.source_of("rendezvous.run_id") == "RALLYPOINT_RENDEZVOUS_RUN_ID (environment)"
    assert r.close_timeout == 45.0
    assert loaded.source_of("rendezvous.close_timeout") == "job.toml"
    assert (r.backend, loaded.source_of("rendezvous.backend")) == ("file", "--rdzv-backend (command line)")
    assert loaded.source_of("rendezvous.heartbeat_timeout", inherit=False) == "default"


def test_env_sets_backend_options(job_file) -> None:
    file = job_file('[rendezvous]\nbackend = "etcd"\n[rendezvous.options]\nendpoints = ["a"]\nprefix = "/rp"\n')

    loaded = load_job_config(file, SCHEMA, environ={"RALLYPOINT_RENDEZVOUS_OPTIONS_ENDPOINTS": '["b", "c"]'})

    assert loaded.config.rendezvous.options == {"endpoints": ["b", "c"], "prefix": "/rp"}
    assert loaded.source_of("rendezvous.options.endpoints[1]") == (
        "RALLYPOINT_RENDEZVOUS_OPTIONS_ENDPOINTS (environment)"
    )
    assert loaded.source_of("rendezvous.options.prefix") == "job.toml"


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
            '[rendezvous]\njoin_timout = "5m"\n',
            "job.toml: rendezvous.join_timout: unknown key 'join_timout' in [rendezvous]; did you mean "
            "'join_timeout'? (known keys: backend, close_timeout, heartbeat_interval, heartbeat_timeout, "
            "join_timeout, last_call_timeout, options, run_id)",
        ),
        ("[rendezvous]\noptions = [1]\n", "job.toml: rendezvous.options: expected a table, got a list"),
        ('[rendezvous]\njoin_timeout = "0s"\n', "job.toml: rendezvous.join_timeout: must be greater than 0, got '0s'"),
        (
            "[rendezvous]\nclose_timeout = -3\n",
            "job.toml: rendezvous.close_timeout: invalid duration -3: must be a finite, non-negative time "
            '(write e.g. "10m" or "30s")',
        ),
        (
            '[rendezvous]\nheartbeat_interval = "20s"\n',
            "job.toml: rendezvous.heartbeat_interval: heartbeat_timeout (10s) must be longer than "
            "heartbeat_interval (20s) (rendezvous.heartbeat_timeout is the default)",
        ),
    ],
)
def test_structure_errors(job_file, toml: str, message: str) -> None:
    assert str(load_error(job_file(toml), environ={})) == message


def test_heartbeats_have_a_floor(job_file) -> None:
    # 1ms / 2ms used to be accepted: rounds ended one after another, and the nodes disagreed on the outcome
    error = load_error(job_file('[rendezvous]\nheartbeat_interval = "1ms"\nheartbeat_timeout = "2ms"\n'), environ={})

    assert str(error).splitlines() == [
        "job.toml: rendezvous.heartbeat_interval: at least 100ms, got 1ms: every node writes to the backend each "
        "interval (default 2s)",
        "job.toml: rendezvous.heartbeat_timeout: at least 500ms, got 2ms: a shorter pause of a node's host would "
        "take it for dead (default 10s)",
    ]
    at_the_floor = '[rendezvous]\nheartbeat_interval = "100ms"\nheartbeat_timeout = "500ms"\n'
    section = load_job_config(job_file(at_the_floor), SCHEMA, environ={}).section(RendezvousSection)
    assert (section.heartbeat_interval, section.heartbeat_timeout) == (0.1, 0.5)


def test_errors_name_the_cli_flag_that_set_the_value(job_file) -> None:
    overrides = [("rendezvous.last_call_timeout", "soon", "--set rendezvous.last_call_timeout (command line)")]

    error = load_error(job_file(LAYERED), environ={}, overrides=overrides)

    assert str(error) == (
        "--set rendezvous.last_call_timeout (command line): rendezvous.last_call_timeout: "
        'invalid duration \'soon\' (write e.g. "10m" or "30s")'
    )
