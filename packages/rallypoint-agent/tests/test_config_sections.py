"""The ``[job]``, ``[nodes]``, ``[ranks]`` and ``[agent]`` sections this package declares (moved from core)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rallypoint.agent.config import AGENT_SECTIONS, AgentSection, JobSection, NodesSection, RanksSection
from rallypoint.agent.records import LAUNCH_ENVIRONMENTS, RANK_STRATEGIES
from rallypoint.core.config import build_schema, load_job_config
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import get_plugin_manager

SCHEMA = build_schema(AGENT_SECTIONS)

SECTIONS = """\
[job]
name = "mnist"
entrypoint = "train.py"
args = ["--epochs", "3"]
env = { OMP_NUM_THREADS = "4" }

[nodes]
min = 2
max = 4
nproc_per_node = 2

[ranks]
strategy = "topology"
[ranks.options]
order = ["rack", "host"]

[agent]
max_restarts = 3
monitor_interval = "100ms"
exit_barrier_timeout = "60s"
log_dir = "runs/{run_id}"
tee = [0, 3]
"""


@pytest.fixture
def job_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)

    def write(text: str, name: str = "job.toml") -> str:
        (tmp_path / name).write_text(textwrap.dedent(text))
        return name

    return write


def load(path: str | None, **kwargs):
    return load_job_config(path, SCHEMA, **kwargs)


def load_error(path: str | None, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(path, **kwargs)
    assert info.value.exit_code == 2
    return info.value


def test_the_package_declares_its_kind_and_sections() -> None:
    pm = get_plugin_manager(autoload=False)

    assert pm.kind("rallypoint_rank_strategies") is RANK_STRATEGIES
    assert RANK_STRATEGIES.config_key == "ranks.strategy"
    assert [s.name for s in AGENT_SECTIONS] == ["job", "nodes", "ranks", "agent", "launch"]
    assert all(s in pm.sections() for s in AGENT_SECTIONS)
    assert {pm.declared_by[f"config section {s.name}"] for s in AGENT_SECTIONS} == {"agent"}
    assert pm.infos["agent"].essential is True
    assert "default" in pm.registry(RANK_STRATEGIES)
    assert pm.kind("rallypoint_launch_environments") is LAUNCH_ENVIRONMENTS
    assert LAUNCH_ENVIRONMENTS.config_key == "launch.environment"
    assert pm.registry(LAUNCH_ENVIRONMENTS).names() == ["kubernetes", "none", "slurm"]


def test_every_section_loads_from_toml(job_file) -> None:
    loaded = load(job_file(SECTIONS), environ={})
    c = loaded.config

    job = loaded.section(JobSection)
    assert (job.name, job.entrypoint, job.module) == ("mnist", "train.py", None)
    assert job.args == ["--epochs", "3"]
    assert job.env == {"OMP_NUM_THREADS": "4"}
    nodes = loaded.section(NodesSection)
    assert (nodes.min, nodes.max, nodes.max_nodes, nodes.nproc_per_node) == (2, 4, 4, 2)
    assert (c.ranks.strategy, c.ranks.options) == ("topology", {"order": ["rack", "host"]})
    a = loaded.section(AgentSection)
    assert (a.max_restarts, a.monitor_interval, a.exit_barrier_timeout) == (3, 0.1, 60.0)
    assert (a.log_dir, a.tee) == ("runs/{run_id}", [0, 3])
    assert loaded.source_of("agent.tee") == "job.toml"


def test_defaults() -> None:
    loaded = load(None, environ={})
    c = loaded.config

    assert c.job.name is None  # the agent's planning derives it from the job file
    assert (c.nodes.min, c.nodes.max, c.nodes.max_nodes, c.nodes.nproc_per_node) == (1, None, 1, 1)
    assert loaded.section(RanksSection).strategy == "default"
    assert (c.agent.max_restarts, c.agent.tee, c.agent.store_head_start) == (3, "all", 0.05)
    assert loaded.source_of("nodes.min") == "default"


def test_max_nodes_in_plain_python() -> None:
    assert SCHEMA.model.model_validate({"nodes": {"min": 2, "max": 4}}).nodes.max_nodes == 4
    assert NodesSection(min=3).max_nodes == 3


@pytest.mark.parametrize(("value", "expected"), [('"auto"', "auto"), ("8", 8), ('"3"', 3)])
def test_nproc_per_node_forms(job_file, value: str, expected: object) -> None:
    loaded = load(job_file(f"[nodes]\nnproc_per_node = {value}\n"), environ={})

    assert loaded.config.nodes.nproc_per_node == expected


@pytest.mark.parametrize(
    ("value", "expected"), [('"all"', "all"), ('"rank0"', "rank0"), ('"none"', "none"), ("[1]", [1])]
)
def test_tee_forms(job_file, value: str, expected: object) -> None:
    assert load(job_file(f"[agent]\ntee = {value}\n"), environ={}).config.agent.tee == expected


def test_env_values_are_read_as_toml_values() -> None:
    environ = {
        "RALLYPOINT_JOB_ARGS": '["--lr", "0.1"]',
        "RALLYPOINT_NODES_NPROC_PER_NODE": "auto",
        "RALLYPOINT_AGENT_TEE": "[0, 2]",
        "RALLYPOINT_JOB_ENTRYPOINT": "train.py",
        "RALLYPOINT_NODES_MAX": "4",
    }

    loaded = load(None, environ=environ)
    c = loaded.config

    assert c.job.args == ["--lr", "0.1"]
    assert c.nodes.nproc_per_node == "auto"
    assert c.agent.tee == [0, 2]
    assert c.job.entrypoint == "train.py"
    assert (c.nodes.max, loaded.source_of("nodes.max")) == (4, "RALLYPOINT_NODES_MAX (environment)")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "[nodes]\nmni = 2\n",
            "job.toml: nodes.mni: unknown key 'mni' in [nodes]; did you mean 'min'? "
            "(known keys: max, min, nproc_per_node)",
        ),
        (
            "[agent]\ncolour = true\n",
            "job.toml: agent.colour: unknown key 'colour' in [agent] (known keys: "
            + ", ".join(sorted(AgentSection.model_fields))
            + ")",
        ),
        ('[nodes]\nmax = "four"\n', "job.toml: nodes.max: expected an integer, got 'four'"),
        ("[nodes]\nmin = 2.5\n", "job.toml: nodes.min: expected an integer, got 2.5"),
        ("[job]\nname = 3\n", "job.toml: job.name: expected a string, got 3"),
        ('[job]\nargs = "--epochs 3"\n', "job.toml: job.args: expected a list, got '--epochs 3'"),
        ('[job]\nargs = ["a", 3]\n', "job.toml: job.args[1]: expected a string, got 3"),
        ("nodes = 3\n", "job.toml: nodes: expected a table, got 3"),
        ("[agent]\nmax_restarts = -1\n", "job.toml: agent.max_restarts: must be at least 0, got -1"),
        ("[nodes]\nmin = 0\n", "job.toml: nodes.min: must be at least 1, got 0"),
        ("[nodes]\nmin = 3\nmax = 2\n", "job.toml: nodes.max: max (2) is smaller than min (3)"),
        (
            '[job]\nentrypoint = "a.py"\nmodule = "a"\n',
            "job.toml: job.module: set either entrypoint or module, not both (module runs as python -m)",
        ),
        (
            "[nodes]\nnproc_per_node = 0\n",
            'job.toml: nodes.nproc_per_node: expected a positive number of workers or "auto", got 0',
        ),
        (
            '[agent]\ntee = "rank1"\n',
            'job.toml: agent.tee: expected "all", "rank0", "none" or a list of ranks such as [0, 3] ("0,3" or "3," '
            "on the command line), got 'rank1'",
        ),
    ],
)
def test_structure_errors(job_file, toml: str, message: str) -> None:
    assert str(load_error(job_file(toml), environ={})) == message


def test_every_problem_is_reported_not_only_the_first(job_file) -> None:
    error = load_error(job_file('[nodes]\nmax = "four"\nmni = 2\n[agent]\nmax_restart = 2\n'), environ={})

    assert [(i.source, i.key) for i in error.issues] == [
        ("job.toml", "nodes.max"),
        ("job.toml", "nodes.mni"),
        ("job.toml", "agent.max_restart"),
    ]


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


def test_values_are_not_coerced_from_strings(job_file) -> None:
    error = load_error(job_file('[nodes]\nmax = "4"\n[agent]\nmax_restarts = "2"\n'), environ={})

    assert [str(i) for i in error.issues] == [
        "job.toml: nodes.max: expected an integer, got '4'",
        "job.toml: agent.max_restarts: expected an integer, got '2'",
    ]
