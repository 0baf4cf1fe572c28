"""``agent.line_prefix``: rallypoint's ``[host:rank] ``, torchrun's ``[default0]:``, or a template (#41 item 4)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from rallypoint.agent import console
from rallypoint.agent.line_prefix import TORCHRUN_ENV, check, from_torchrun, prefix_of
from rallypoint.agent.logs import WorkerLogs
from rallypoint.agent.plan import NodeFacts, plan_job
from rallypoint.agent.ranks.model import WorkerRanks
from rallypoint.core.config import load_job_config, resolve_config
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import get_plugin_manager

JOB = '[job]\nentrypoint = "train.py"\n'


def worker(rank: int, local_rank: int) -> WorkerRanks:
    return WorkerRanks(node_id="n", local_rank=local_rank, rank=rank, world_size=8, role="default", role_rank=rank,
                       role_world_size=8, local_world_size=4, group_rank=1, group_world_size=2)  # fmt: skip


def plan_prefix(tmp_path: Path, text: str, environ: dict[str, str]) -> str:
    (tmp_path / "train.py").write_text("pass\n")
    (tmp_path / "job.toml").write_text(text)
    pm = get_plugin_manager()
    resolved = resolve_config(load_job_config(tmp_path / "job.toml", pm, environ={}), pm)
    facts = NodeFacts(host="h", pid=1, environ=environ, cwd=tmp_path, visible_gpus=0, cpu_count=2,
                      job_file=tmp_path / "job.toml", run_token="t", executable=sys.executable)  # fmt: skip
    return plan_job(resolved, facts).settings.line_prefix


def test_the_presets_and_a_template() -> None:
    assert prefix_of(check("rallypoint"), "gpu-3", worker(5, 1)) == "[gpu-3:5] "
    assert prefix_of(check("torchrun"), "gpu-3", worker(5, 1)) == "[default1]:"
    assert prefix_of(check("{host}/{role}{rank}|{local_rank}> "), "gpu-3", worker(5, 1)) == "gpu-3/default5|1> "
    assert prefix_of(check("{{{rank}}} "), "h", worker(5, 1)) == "{5} "


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("{user}", "'{user}' names {user}; a prefix may use {host}, {rank}, {local_rank}, {role}"),
        ("{rank:>3}", "without a format or conversion"),
        ("[{rank]", "is not a template"),
    ],
)
def test_a_bad_template_is_refused_naming_the_key(tmp_path: Path, value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_prefix(tmp_path, JOB + f"[agent]\nline_prefix = {value!r}\n", {})
    assert "agent.line_prefix" in str(err.value)
    assert problem in str(err.value)


def test_torchruns_variable_is_honoured_unless_the_job_sets_the_key(tmp_path: Path) -> None:
    env = {TORCHRUN_ENV: "[${role_name}${rank}|$local_rank]:"}
    assert plan_prefix(tmp_path, JOB, env) == "[{role}{rank}|{local_rank}]:"
    assert plan_prefix(tmp_path, JOB + '[agent]\nline_prefix = "torchrun"\n', env) == "[{role}{local_rank}]:"
    assert plan_prefix(tmp_path, JOB, {}) == "[{host}:{rank}] "
    assert from_torchrun({TORCHRUN_ENV: "{${rank}}"}) == "{{{rank}}}"  # braces of the template stay literal
    with pytest.raises(ConfigError, match=r"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE \(environment\): agent.line_prefix"):
        plan_prefix(tmp_path, JOB, {TORCHRUN_ENV: "[${node}]"})


def test_worker_lines_carry_their_prefix(tmp_path: Path) -> None:
    out = io.StringIO()
    logs = WorkerLogs(None, host="h", console_out=out, prefixes={3: "[default1]:"})
    read, write = os.pipe()
    logs.attach(3, read, None)
    with open(write, "wb") as f:
        f.write(b"hello\nworld\n")
    logs.close()
    console.flush(5)
    assert out.getvalue() == "[default1]:hello\n[default1]:world\n"
