"""The plan decides once what a launch environment brings (#37): filled-in keys, node id, notices, restart count."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent.launch import resolve_in_environment, slurm
from rallypoint.agent.plan import NodeFacts, plan_job
from rallypoint.agent.settings import install_signal_handlers
from rallypoint.core.cli import main
from rallypoint.core.config import load_job_config
from rallypoint.core.plugins import get_plugin_manager

SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[03-05]",
    "SLURM_JOB_NUM_NODES": "3",
    "SLURMD_NODENAME": "gpu04",
    "SLURM_NODEID": "1",
    "SLURM_RESTART_COUNT": "2",
}


def _plan(tmp_path: Path, text: str, environ: dict[str, str], **facts: Any) -> Any:
    job = tmp_path / "job.toml"
    job.write_text('[job]\nentrypoint = "train.py"\n' + text)
    (tmp_path / "train.py").write_text("pass\n")
    pm = get_plugin_manager()

    def load(filled: Any) -> Any:
        return load_job_config(job, pm, environ={}, overrides=list(filled))

    resolved, launch = resolve_in_environment(load, pm, environ)
    node = NodeFacts(host="gpu04", pid=7, environ=environ, cwd=tmp_path, job_file=job, launch=launch, **facts)
    return resolved, plan_job(resolved, node)


def test_the_plan_holds_what_slurm_decides(tmp_path: Path) -> None:
    resolved, plan = _plan(tmp_path, "", SLURM)
    assert plan.launch == slurm.detect(SLURM)
    assert (plan.rendezvous.run_id, plan.rendezvous.min_nodes, plan.rendezvous.max_nodes) == ("slurm-4242", 3, 3)
    assert plan.node.node_id == "gpu04"
    settings = plan.settings
    assert settings.notice_signals == (signal.SIGTERM, signal.SIGUSR2)
    # SIGTERM stops the agent (signals_to_handle); the warning SIGUSR2 is for the workers: the agent outlives it
    assert settings.ignored_signals == (signal.SIGUSR2,)
    assert settings.worker_env["RALLYPOINT_PREEMPTION_SIGNALS"] == "SIGTERM,SIGUSR2"
    assert settings.worker_env["RALLYPOINT_LAUNCH_RESTART_COUNT"] == "2"
    assert resolved.loaded.source_of("rendezvous.options.endpoint") == "slurm (SLURM_JOB_NODELIST)"
    assert settings.fixed_allocation == "slurm"  # a lost host is not replaced: a job that needs it fails at once


def test_job_keys_and_flags_win_over_the_environment(tmp_path: Path) -> None:
    text = (
        '[nodes]\nmin = 2\n[agent]\nsignals_to_handle = "SIGTERM,SIGUSR2"\n'
        '[job.env]\nRALLYPOINT_PREEMPTION_SIGNALS = "SIGTERM"\n'
    )
    _, plan = _plan(tmp_path, text, SLURM, node_id="mine")
    assert (plan.rendezvous.min_nodes, plan.rendezvous.max_nodes) == (2, 3)
    assert plan.node.node_id == "mine"  # --node-id
    assert plan.settings.ignored_signals == ()  # the job stops the agent on SIGUSR2: nothing to outlive
    assert plan.settings.worker_env["RALLYPOINT_PREEMPTION_SIGNALS"] == "SIGTERM"  # [job] env wins


def test_without_a_launch_environment_nothing_is_added(tmp_path: Path) -> None:
    _, plan = _plan(tmp_path, "", {})
    assert plan.launch is None
    assert (plan.settings.notice_signals, plan.settings.ignored_signals) == ((), ())
    assert plan.settings.fixed_allocation is None  # a lost node may come back: wait for it
    assert "RALLYPOINT_PREEMPTION_SIGNALS" not in plan.settings.worker_env


def test_the_agent_outlives_an_ignored_signal_and_its_children_do_not_inherit_the_ignore() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    restore = install_signal_handlers([], [signal.SIGUSR2])
    try:
        handler = signal.getsignal(signal.SIGUSR2)
        assert callable(handler)  # a handler, not SIG_IGN: exec resets it to the default in workers
        os.kill(os.getpid(), signal.SIGUSR2)  # the test process goes on
    finally:
        restore()
    assert signal.getsignal(signal.SIGUSR2) == before


@pytest.fixture
def slurm_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith(("RALLYPOINT_", "SLURM", "PET_"))]:
        monkeypatch.delenv(name)
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "train.py").write_text("pass\n")
    job = tmp_path / "job.toml"
    job.write_text('[job]\nentrypoint = "train.py"\n')
    return job


def test_dry_run_shows_the_launch_environment_and_leaves_signals_alone(
    slurm_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = signal.getsignal(signal.SIGUSR2)
    assert main(["run", "--dry-run", "--json", str(slurm_env)]) == 0
    assert signal.getsignal(signal.SIGUSR2) == before  # planning installs nothing: the agent does, when it runs
    out = json.loads(capsys.readouterr().out)
    plan = out["plan"]
    assert plan["launch"]["environment"] == "slurm"
    assert (plan["launch"]["node_rank"], plan["launch"]["restart_count"]) == (1, 2)
    assert plan["agent"]["notice_signals"] == ["SIGTERM", "SIGUSR2"]
    assert plan["agent"]["ignored_signals"] == ["SIGUSR2"]
    assert plan["node"]["node_id"] == "gpu04"
    assert out["sources"]["nodes.min"] == "slurm (SLURM_JOB_NUM_NODES)"
    assert out["sources"]["rendezvous.run_id"] == "slurm (SLURM_JOB_ID)"
    assert main(["run", "--dry-run", str(slurm_env)]) == 0
    text = capsys.readouterr().out
    assert "# launch environment: slurm (node rank 1 of 3, restarted 2 time(s) by it)" in text
    assert "# preemption notices: SIGTERM,SIGUSR2; the agent outlives SIGUSR2" in text


def test_flags_win_in_the_dry_run(slurm_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--dry-run", "--json", "--nnodes", "2:3", "--rdzv-id", "mine", "--node-id", "n9", str(slurm_env)]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["run_id"] == "mine"
    assert (out["plan"]["rendezvous"]["min_nodes"], out["plan"]["rendezvous"]["max_nodes"]) == (2, 3)
    assert out["plan"]["node"]["node_id"] == "n9"
    assert out["sources"]["rendezvous.options.endpoint"] == "slurm (SLURM_JOB_NODELIST)"


def test_config_show_names_the_variable_each_value_came_from(
    slurm_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "show", str(slurm_env)]) == 0
    text = capsys.readouterr().out
    assert "min = 3  # slurm (SLURM_JOB_NUM_NODES)" in text
    assert 'run_id = "slurm-4242"  # slurm (SLURM_JOB_ID)' in text
    assert 'endpoint = "gpu03:29400"  # slurm (SLURM_JOB_NODELIST)' in text
    assert main(["config", "show", "--json", "--set", "nodes.min=2", str(slurm_env)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sources"]["nodes.max"] == "slurm (SLURM_JOB_NUM_NODES)"
    assert (out["config"]["nodes"]["min"], out["sources"]["nodes.min"]) == (2, "--set nodes.min (command line)")
    assert out["config"]["rendezvous"]["run_id"] == "slurm-4242"
    assert out["sources"]["rendezvous.backend"] == "slurm (launch environment default)"


def test_config_show_outside_an_allocation_fills_in_nothing(
    slurm_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in SLURM:
        monkeypatch.delenv(name)
    assert main(["config", "show", "--json", str(slurm_env)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["sources"]["nodes.min"], out["sources"]["rendezvous.backend"]) == ("default", "default")
    assert out["config"]["rendezvous"].get("run_id") is None


def test_config_show_refuses_a_named_environment_that_is_not_there(
    slurm_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in SLURM:
        monkeypatch.delenv(name)
    slurm_env.write_text(slurm_env.read_text() + '[launch]\nenvironment = "slurm"\n')
    assert main(["config", "show", str(slurm_env)]) == 2
    err = capsys.readouterr().err
    assert "launch.environment" in err
    assert "'slurm' is selected" in err
    assert str(slurm_env) in err


def test_a_kubernetes_job_is_no_fixed_allocation(tmp_path: Path) -> None:
    env = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "t-1", "RALLYPOINT_K8S_NNODES": "2", "RALLYPOINT_K8S_SERVICE": "s"}
    _, plan = _plan(tmp_path, "", env)
    assert plan.launch.environment == "kubernetes"
    assert plan.settings.fixed_allocation is None  # the Job recreates a failed pod
    assert plan.settings.ignored_signals == ()
