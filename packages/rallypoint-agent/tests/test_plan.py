"""Tests of rallypoint.agent.plan: planning a node's run from the resolved job and the node's facts."""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from rallypoint.agent import worker_main
from rallypoint.agent.env import ROLE_ENV
from rallypoint.agent.plan import JobPlan, NodeFacts, plan_job, visible_gpus, worker_argv
from rallypoint.agent.ranks import DefaultStrategy
from rallypoint.agent.records import RankStrategyRecord
from rallypoint.collectives.records import CollectiveBackendRecord
from rallypoint.core.config import PerWorker, ResolvedConfig, load_job_config, resolve_config
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import RallypointPluginManager, get_plugin_manager, hookimpl
from rallypoint.rendezvous.memory import MemoryOptions


class TunedOptions(BaseModel):
    """A collective backend's options, to see them reach the worker environment."""

    model_config = ConfigDict(extra="forbid")

    buffer_mb: int = 4
    algorithm: str = "ring"
    timeout: float = 1.5


class TunedCollectives:
    """A test plugin: a collective backend with an options model."""

    @hookimpl
    def rallypoint_collective_backends(self) -> list[CollectiveBackendRecord]:
        return [CollectiveBackendRecord(name="tuned", torch_backend="gloo", options_model=TunedOptions)]


class BrokenStrategies:
    """A test plugin: rank strategies that cannot be loaded."""

    @hookimpl
    def rallypoint_rank_strategies(self) -> list[RankStrategyRecord]:
        return [RankStrategyRecord(name="gone", factory="no_such_module_here:Strategy")]


@pytest.fixture(scope="module")
def pm() -> RallypointPluginManager:
    return get_plugin_manager(plugins={"tuned": TunedCollectives(), "broken": BrokenStrategies()})


@pytest.fixture
def resolve(pm: RallypointPluginManager, tmp_path: Path) -> Any:
    """``resolve(toml_text | None, *overrides, name="job.toml")`` -> ResolvedConfig (no RALLYPOINT_* env)."""

    def make(text: str | None, *overrides: tuple[str, Any], name: str = "job.toml") -> ResolvedConfig:
        path = None
        if text is not None:
            path = tmp_path / name
            path.write_text(text)
        flags = [(key, value, "test (command line)") for key, value in overrides]
        return resolve_config(load_job_config(path, pm, environ={}, overrides=flags), pm)

    return make


@pytest.fixture
def train(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    return script


def facts(tmp_path: Path, **changes: Any) -> NodeFacts:
    values: dict[str, Any] = {
        "host": "node-a",
        "pid": 4242,
        "environ": {},
        "cwd": tmp_path,
        "visible_gpus": 0,
        "cpu_count": 6,
        "job_file": tmp_path / "job.toml",
        "run_token": "cafe0123",
        "executable": "/usr/bin/python3",
    }
    values.update(changes)
    return NodeFacts(**values)


def test_a_single_node_job_from_a_job_file(resolve, train: Path, tmp_path: Path) -> None:
    resolved = resolve('[job]\nentrypoint = "train.py"\nargs = ["--lr", "0.1"]\n', name="mnist.toml")
    plan = plan_job(resolved, facts(tmp_path, job_file=tmp_path / "mnist.toml"))

    assert isinstance(plan, JobPlan)
    settings = plan.settings
    # the job is named after its file; a single-node job gets a generated run id
    assert settings.run_id == plan.rendezvous.run_id == "mnist-cafe0123"
    assert settings.log_dir == Path("runs/mnist-cafe0123")
    # a relative entrypoint of a job file is found next to the file, and runs unbuffered through
    # worker_main (which ends the worker without the interpreter's finalization)
    assert settings.argv == ["/usr/bin/python3", "-u", worker_main.PATH, str(train), "--lr", "0.1"]
    assert settings.host == "node-a"
    assert settings.worker_env["RALLYPOINT_CONFIG"] == str(tmp_path / "mnist.toml")
    assert isinstance(settings.strategy, DefaultStrategy)  # loaded by the plan, once
    assert settings.strategy_name == "default"
    assert settings.watchdog is None  # [timer] watchdog = "off"
    assert settings.tee == "all"
    node = plan.node
    assert (node.node_id, node.host, node.local_world_size) == ("node-a-4242", "node-a", 1)
    # the memory backend: loopback address, and a namespace of its own per agent process
    assert node.addr == "127.0.0.1"
    assert plan.rendezvous.record.name == "memory"
    assert plan.rendezvous.backend.options == MemoryOptions(namespace="run-4242")
    assert (plan.rendezvous.min_nodes, plan.rendezvous.max_nodes) == (1, 1)


def test_the_job_name_is_job_name_then_the_file_stem_then_job(resolve, train: Path, tmp_path: Path) -> None:
    named = resolve('[job]\nname = "resnet"\nentrypoint = "train.py"\n', name="mnist.toml")
    assert plan_job(named, facts(tmp_path, job_file=tmp_path / "mnist.toml")).settings.run_id == "resnet-cafe0123"
    no_file = resolve(None, ("job.entrypoint", str(train)))
    plan = plan_job(no_file, facts(tmp_path, job_file=None, script_from_cli=True))
    assert plan.settings.run_id == "job-cafe0123"
    assert "RALLYPOINT_CONFIG" not in plan.settings.worker_env


def test_planning_does_not_touch_the_resolved_config(resolve, train: Path, tmp_path: Path) -> None:
    resolved = resolve('[job]\nentrypoint = "train.py"\n[nodes]\nnproc_per_node = "auto"\n')
    config_before = resolved.config.model_dump()
    selections_before = dict(resolved.selections)
    options_before = resolved.selections["rendezvous.backend"].options.model_dump()

    first = plan_job(resolved, facts(tmp_path))
    second = plan_job(resolved, facts(tmp_path))

    assert first == second  # the same inputs give the same plan
    assert resolved.config.model_dump() == config_before
    assert resolved.config.rendezvous.run_id is None
    assert resolved.config.job.name is None
    assert resolved.selections == selections_before
    assert resolved.selections["rendezvous.backend"].options.model_dump() == options_before


def test_a_run_id_from_the_config_is_kept(resolve, train: Path, tmp_path: Path) -> None:
    resolved = resolve(
        '[job]\nentrypoint = "train.py"\n[rendezvous]\nrun_id = "exp-7"\n[agent]\nlog_dir = "/logs/{job}/{run_id}"\n'
    )
    settings = plan_job(resolved, facts(tmp_path)).settings
    assert settings.run_id == "exp-7"
    assert settings.log_dir == Path("/logs/job/exp-7")


def test_a_log_dir_template_with_an_unknown_field_is_a_config_error(resolve, train: Path, tmp_path: Path) -> None:
    # the template is checked when the [agent] section is validated, before any plan is made
    with pytest.raises(ConfigError, match=r"job.toml: agent.log_dir: '\{user\}' is not a name the template knows"):
        resolve('[job]\nentrypoint = "train.py"\n[agent]\nlog_dir = "runs/{user}"\n')


def test_a_multi_node_job_needs_a_shared_backend_and_a_run_id(resolve, train: Path, tmp_path: Path) -> None:
    memory = resolve('[job]\nentrypoint = "train.py"\n[nodes]\nmin = 2\n')
    with pytest.raises(ConfigError, match="backend 'memory' only works within one agent process") as info:
        plan_job(memory, facts(tmp_path))
    # the backend is the default: the error is located at the node count the file set
    assert (info.value.issues[0].source, info.value.issues[0].key) == (str(tmp_path / "job.toml"), "nodes.min")

    rdzv = tmp_path / "rdzv"
    no_run_id = resolve(
        f'[job]\nentrypoint = "train.py"\n[nodes]\nmin = 1\nmax = 2\n'
        f'[rendezvous]\nbackend = "file"\n[rendezvous.options]\npath = "{rdzv}"\n'
    )
    with pytest.raises(ConfigError, match="a multi-node job needs a run id that every node shares") as info:
        plan_job(no_run_id, facts(tmp_path))
    assert info.value.issues[0].key == "rendezvous.run_id"

    shared = resolve(
        f'[job]\nentrypoint = "train.py"\n[nodes]\nmin = 1\nmax = 2\n'
        f'[rendezvous]\nbackend = "file"\nrun_id = "r"\njoin_timeout = "2m"\n[rendezvous.options]\npath = "{rdzv}"\n'
    )
    plan = plan_job(shared, facts(tmp_path, local_addr="10.0.0.7", node_id="n1"))
    assert (plan.rendezvous.run_id, plan.rendezvous.min_nodes, plan.rendezvous.max_nodes) == ("r", 1, 2)
    assert plan.rendezvous.timeouts.join == 120.0
    # options of other backends are handed on as resolved
    assert plan.rendezvous.backend is shared.selections["rendezvous.backend"]
    assert (plan.node.node_id, plan.node.addr) == ("n1", "10.0.0.7")


def test_a_shared_backend_publishes_the_host_name_as_address(resolve, train: Path, tmp_path: Path) -> None:
    resolved = resolve(
        f'[job]\nentrypoint = "train.py"\n[rendezvous]\nbackend = "file"\n[rendezvous.options]\npath = "{tmp_path}"\n'
    )
    assert plan_job(resolved, facts(tmp_path)).node.addr == "node-a"


@pytest.mark.parametrize(("gpus", "expected"), [(0, 6), (4, 4)])
def test_nproc_auto_counts_gpus_else_cpus(resolve, train: Path, tmp_path: Path, gpus: int, expected: int) -> None:
    resolved = resolve('[job]\nentrypoint = "train.py"\n[nodes]\nnproc_per_node = "auto"\n')
    assert plan_job(resolved, facts(tmp_path, visible_gpus=gpus)).node.local_world_size == expected


def test_worker_env_carries_collectives_settings_and_job_env(resolve, train: Path, tmp_path: Path) -> None:
    resolved = resolve(
        '[job]\nentrypoint = "train.py"\n[job.env]\nOMP_NUM_THREADS = "4"\n'
        '[collectives]\nbackend = "tuned"\ntimeout = "90s"\n[collectives.options]\nbuffer_mb = 16\n'
    )
    env = plan_job(resolved, facts(tmp_path)).settings.worker_env
    assert env["RALLYPOINT_COLLECTIVES_BACKEND"] == "tuned"
    assert env["RALLYPOINT_COLLECTIVES_TIMEOUT"] == "90"
    # the options validated by resolution, defaults filled in, as a JSON object
    assert json.loads(env["RALLYPOINT_COLLECTIVES_OPTIONS"]) == {"buffer_mb": 16, "algorithm": "ring", "timeout": 1.5}
    assert env["OMP_NUM_THREADS"] == "4"


def test_collectives_options_are_an_empty_object_without_a_model(resolve, train: Path, tmp_path: Path) -> None:
    resolved = resolve('[job]\nentrypoint = "train.py"\n[collectives]\nbackend = "auto"\n')
    assert plan_job(resolved, facts(tmp_path)).settings.worker_env["RALLYPOINT_COLLECTIVES_OPTIONS"] == "{}"


def test_job_env_may_override_rallypoint_variables(resolve, train: Path, tmp_path: Path) -> None:
    resolved = resolve('[job]\nentrypoint = "train.py"\n[job.env]\nRALLYPOINT_COLLECTIVES_TIMEOUT = "5"\n')
    assert plan_job(resolved, facts(tmp_path)).settings.worker_env["RALLYPOINT_COLLECTIVES_TIMEOUT"] == "5"


def test_strategy_and_watchdog_come_with_their_validated_options(resolve, train: Path, tmp_path: Path) -> None:
    resolved = resolve(
        '[job]\nentrypoint = "train.py"\n[ranks]\nstrategy = "topology"\n[ranks.options]\norder = ["rack"]\n'
        '[timer]\nwatchdog = "file"\ntimeline = true\n'
        '[agent]\nmax_restarts = 7\nmonitor_interval = "250ms"\ntee = [0, 2]\nstore_head_start = "0s"\n'
    )
    settings = plan_job(resolved, facts(tmp_path)).settings
    assert type(settings.strategy).__name__ == "TopologyStrategy"  # loaded by the plan, once
    assert settings.strategy_name == "topology"
    assert settings.strategy_options is resolved.selections["ranks.strategy"].options
    assert settings.watchdog is not None
    assert settings.watchdog.name == "file"
    assert settings.watchdog_options is resolved.selections["timer.watchdog"].options
    # the timer section's own worker variable: one log per worker, filled in by the agent
    assert settings.worker_env["RALLYPOINT_TIMELINE_FILE"] == "{attempt_dir}/timeline/rank_{rank}.jsonl"
    assert isinstance(settings.worker_env["RALLYPOINT_TIMELINE_FILE"], PerWorker)
    assert (settings.max_restarts, settings.monitor_interval, settings.store_head_start) == (7, 0.25, 0.0)
    assert settings.tee == (0, 2)


def test_the_node_record_carries_labels_and_scheduler_variables(resolve, train: Path, tmp_path: Path) -> None:
    labels = tmp_path / "labels"
    labels.write_text("rack=r1\nzone=z1\n")
    environ = {
        "RALLYPOINT_NODE_LABELS": "zone=z9",
        "RALLYPOINT_NODE_LABELS_FILE": str(labels),
        "SLURM_PROCID": "3",
        "HOME": "/root",
    }
    node = plan_job(resolve('[job]\nentrypoint = "train.py"\n'), facts(tmp_path, environ=environ)).node
    assert dict(node.labels) == {"rack": "r1", "zone": "z9"}
    assert dict(node.env) == {"SLURM_PROCID": "3"}


def test_nothing_to_run_is_a_config_error(resolve, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nothing to run: give SCRIPT \[ARGS...\]"):
        plan_job(resolve("[nodes]\nmin = 1\n"), facts(tmp_path))


class Job:
    def __init__(self, entrypoint: str | None = None, module: str | None = None, args: tuple[str, ...] = ()) -> None:
        self.entrypoint, self.module, self.args = entrypoint, module, list(args)


def test_worker_argv(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text("")
    (tmp_path / "here.py").write_text("")
    (tmp_path / "tool").write_text("")
    base, py = tmp_path / "jobs", "/py"

    def argv(job: Job, cli: bool) -> list[str]:
        return worker_argv(job, script_from_cli=cli, base=base, cwd=tmp_path, executable=py, source="where")

    main = worker_main.PATH  # Python scripts and modules run through it
    assert argv(Job(module="pkg.main", args=("-x",)), False) == [py, "-u", main, "-m", "pkg.main", "-x"]
    # from the job file: relative to the file; from the command line: as typed, from the cwd
    assert argv(Job("train.py"), False) == [py, "-u", main, str(base / "train.py")]
    assert argv(Job("here.py", args=("a",)), True) == [py, "-u", main, "here.py", "a"]
    assert argv(Job("bin/run"), False) == [str(base / "bin" / "run")]
    # a program: a bare name is looked up on PATH unless a file of that name is in the cwd
    assert argv(Job("hostname"), True) == ["hostname"]
    assert argv(Job("tool"), True) == ["./tool"]
    assert argv(Job("./tool", args=("b",)), True) == ["./tool", "b"]
    assert argv(Job("/bin/true"), True) == ["/bin/true"]
    with pytest.raises(ConfigError, match=r"^where: job\.entrypoint: no such script: missing\.py$"):
        argv(Job("missing.py"), True)
    with pytest.raises(ConfigError, match=r"no such script: .*jobs/here\.py"):
        argv(Job("here.py"), False)


def test_visible_gpus(tmp_path: Path) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,3"}, dev=tmp_path) == 3
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, dev=tmp_path) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, dev=tmp_path) == 0
    assert visible_gpus({}, dev=tmp_path) == 0
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).write_text("")
    assert visible_gpus({}, dev=tmp_path) == 2


def test_gather_reads_the_running_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RALLYPOINT_TEST_MARK", "1")
    gathered = NodeFacts.gather(job_file="job.toml", script_from_cli=True, node_id="n", local_addr="a")
    assert gathered.pid == os.getpid()
    assert gathered.cwd == Path.cwd()
    assert gathered.job_file == tmp_path.resolve() / "job.toml"
    assert gathered.environ["RALLYPOINT_TEST_MARK"] == "1"
    assert gathered.executable == sys.executable
    assert (gathered.script_from_cli, gathered.node_id, gathered.local_addr) == (True, "n", "a")
    assert len(gathered.run_token) == 8
    assert NodeFacts.gather(host_name="h").host == "h"
    assert NodeFacts.gather().run_token != gathered.run_token


def test_without_collectives_and_timer_packages_their_settings_are_left_out(train: Path, tmp_path: Path) -> None:
    # the agent does not depend on rallypoint-collectives or rallypoint-timer: without them the
    # job has no [collectives] or [timer] section, and the workers get none of their variables
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # plugins of the disabled packages fail to load
        bare = get_plugin_manager(disabled=["collectives", "timer"], autoload=False)
    loaded = load_job_config(None, bare, environ={}, overrides=[("job.entrypoint", str(train), "test")])
    settings = plan_job(resolve_config(loaded, bare), facts(tmp_path, job_file=None)).settings
    assert not [k for k in settings.worker_env if k.startswith("RALLYPOINT_COLLECTIVES_")]
    assert settings.watchdog is None
    assert "RALLYPOINT_TIMELINE_FILE" not in settings.worker_env


def test_a_strategy_that_cannot_load_is_a_config_error_before_anything_starts(
    resolve, train: Path, tmp_path: Path
) -> None:
    # (a missing requirement is refused earlier, by config resolution)
    resolved = resolve('[job]\nentrypoint = "train.py"\n[ranks]\nstrategy = "gone"\n')
    with pytest.raises(ConfigError) as info:
        plan_job(resolved, facts(tmp_path))
    (issue,) = info.value.issues
    assert (issue.source, issue.key) == (str(tmp_path / "job.toml"), "ranks.strategy")
    assert "no_such_module_here" in issue.message


def test_torchrun_settings_are_in_the_plan(resolve, train: Path, tmp_path: Path) -> None:
    resolved = resolve(
        '[job]\nentrypoint = "train.py"\n[agent]\nrole = "trainer"\nshutdown_timeout = "7s"\n'
        'signals_to_handle = "SIGTERM,SIGUSR1"\npreload = ["json"]\npreload_keep = "1m"\n'
    )
    plan = plan_job(resolved, facts(tmp_path))
    settings = plan.settings
    assert (settings.stop_grace, settings.preload_keep) == (7.0, 60.0)
    assert settings.signals == (signal.SIGTERM, signal.SIGUSR1)
    assert settings.worker_env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGUSR1"
    assert settings.worker_env[ROLE_ENV] == "trainer"
    assert plan.rendezvous.fingerprint["role"] == "trainer"  # a node of another role is another job
    default = plan_job(resolve('[job]\nentrypoint = "train.py"\n'), facts(tmp_path))
    assert "role" not in default.rendezvous.fingerprint
    assert ROLE_ENV not in default.settings.worker_env
