"""``rallypoint run --dry-run [--json]`` prints the plan ``rallypoint run`` would act on (#37)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rallypoint.core.cli import main

JOB = """
[job]
name = "seen"
entrypoint = "train.py"
args = ["--lr", "0.1"]
[job.env]
MY_FLAG = "on"
[nodes]
nproc_per_node = 3
[agent]
role = "trainer"
shutdown_timeout = "4s"
max_restarts = 5
signals_to_handle = "SIGTERM,SIGUSR2"
"""


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith("RALLYPOINT_")]:
        monkeypatch.delenv(name)
    (tmp_path / "train.py").write_text("pass\n")
    path = tmp_path / "job.toml"
    path.write_text(JOB)
    return path


def test_json_holds_the_plan(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--dry-run", "--json", str(job)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"config", "sources", "plugins", "plan"}
    assert out["sources"]["agent.role"] == str(job)
    plan = out["plan"]
    assert plan["run_id"].startswith("seen-")
    assert plan["rendezvous"]["backend"] == "memory"
    assert plan["rendezvous"]["fingerprint"]["role"] == "trainer"
    assert plan["ranks"] == {"strategy": "default", "options": None}
    assert plan["agent"]["stop_grace"] == 4.0
    assert plan["agent"]["max_restarts"] == 5
    assert plan["agent"]["signals"] == ["SIGTERM", "SIGUSR2"]
    assert plan["agent"]["log_dir"] == f"runs/{plan['run_id']}"
    assert plan["workers"]["count"] == 3
    assert plan["workers"]["argv"][-3:] == [str(job.parent / "train.py"), "--lr", "0.1"]
    env = plan["workers"]["env"]
    assert env["MY_FLAG"] == "on"
    assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGUSR2"
    assert env["RALLYPOINT_CONFIG"] == str(job)


def test_text_shows_the_same_plan_after_the_resolved_job(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--dry-run", str(job)]) == 0
    text = capsys.readouterr().out
    job_part, _, plan_part = text.partition("# the plan (")
    assert 'role = "trainer"' in job_part
    assert "# rank strategy: default" in plan_part
    assert "# restarts: 5 for the whole job; workers stopped with 4s between SIGTERM and SIGKILL" in plan_part
    assert "the agent handles SIGTERM,SIGUSR2" in plan_part
    assert ", 3 worker(s)" in plan_part
    assert "#   MY_FLAG=on" in plan_part


def test_json_without_dry_run_is_a_usage_error(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", str(job)]) == 2
    assert "--json prints the plan of --dry-run" in capsys.readouterr().err


@pytest.mark.parametrize("backend_from", ["flag", "environment"])
def test_rdzv_endpoint_reads_and_validates_the_job_file_once(
    job: Path,
    tmp_path: Path,
    backend_from: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The endpoint's key depends on the backend; the job used to be loaded a second time to set it.
    from rallypoint.core import config
    from rallypoint.core.config import loader

    reads: list[Path] = []
    loads: list[object] = []
    read_toml, load_job_config = loader._read_toml, config.load_job_config
    monkeypatch.setattr(loader, "_read_toml", lambda path: reads.append(path) or read_toml(path))
    monkeypatch.setattr(config, "load_job_config", lambda *a, **k: loads.append(a) or load_job_config(*a, **k))
    flags = ["--rdzv-backend", "file"]
    if backend_from == "environment":
        monkeypatch.setenv("RALLYPOINT_RENDEZVOUS_BACKEND", "file")
        flags = []
    endpoint = str(tmp_path / "rdzv")
    assert main(["run", "--dry-run", "--json", *flags, "--rdzv-endpoint", endpoint, str(job)]) == 0
    assert (len(reads), len(loads)) == (1, 1)
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["rendezvous"]["backend"] == "file"
    options = {k for k, v in out["sources"].items() if k.startswith("rendezvous.options.") and v != "default"}
    assert [out["sources"][k] for k in options] == ["--rdzv-endpoint (command line)"]
    assert out["config"]["rendezvous"]["options"][options.pop().rpartition(".")[2]] == endpoint


def test_rdzv_endpoint_with_an_unknown_backend_names_the_backend_once(
    job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--dry-run", "--rdzv-backend", "nosuch", "--rdzv-endpoint", str(tmp_path), str(job)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("nosuch") >= 1
    assert "rdzv-endpoint" not in err
