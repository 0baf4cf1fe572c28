"""The end-to-end suite's main scenarios again, with warm workers (``[agent] preload = ["torch"]``).

The scenarios are test_run.py's own functions, run here a second time with
``RALLYPOINT_AGENT_PRELOAD=torch`` in every agent's environment: the same jobs, the same
assertions (environment, restarts, ``@record`` error files and the root-cause report, signal
names, SIGTERM forwarding, no orphans after an agent's SIGKILL, ``-m`` and tee, the watchdog,
the timeline). A last test checks the workers really were forked from the warm process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from rallypoint.agent.warm.keep import kept_servers


def _load_suite() -> ModuleType:
    """test_run.py as a module of its own name, so that patching it here leaves test_run's run alone."""
    spec = importlib.util.spec_from_file_location("warm_copy_of_test_run", Path(__file__).with_name("test_run.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


suite = _load_suite()
_plain_agent_env = suite.agent_env
_kept: dict[str, str] = {}  # RALLYPOINT_AGENT_PRELOAD_KEEP in the "kept" mode


def _base_env(**extra: str) -> dict[str, str]:
    """An agent's environment without the preload variable (and with the keep one in the "kept" mode)."""
    return {**_plain_agent_env(**extra), **_kept}


def _preloading_agent_env(**extra: str) -> dict[str, str]:
    env = _base_env(**extra)
    env["RALLYPOINT_AGENT_PRELOAD"] = "torch"
    return env


@pytest.fixture(autouse=True, params=["fresh", "kept"])
def _preload(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test twice: a warm process per agent, and one kept for the next agent (``preload_keep``).

    In the "kept" mode each test has a runtime directory of its own (``XDG_RUNTIME_DIR``), so
    its first agent starts the kept warm process and the test's later agents reuse it; the
    ones left at the end are killed.
    """
    monkeypatch.setattr(suite, "agent_env", _preloading_agent_env)
    if request.param == "fresh":
        yield
        return
    monkeypatch.setitem(_kept, "RALLYPOINT_AGENT_PRELOAD_KEEP", "30s")
    with _private_runtime(monkeypatch):
        yield


@contextlib.contextmanager
def _private_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A runtime directory of the test's own for kept warm processes; those left in it are killed."""
    runtime = tempfile.mkdtemp(prefix="rpw")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    try:
        yield runtime
    finally:
        for info in kept_servers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(info["pid"]), signal.SIGKILL)
        shutil.rmtree(runtime, ignore_errors=True)


test_a_torchrun_script_runs_unmodified_with_the_full_environment = (
    suite.test_a_torchrun_script_runs_unmodified_with_the_full_environment
)
test_a_crashing_worker_is_restarted_and_the_job_succeeds = (
    suite.test_a_crashing_worker_is_restarted_and_the_job_succeeds
)
test_exhausting_the_budget_gives_one_root_cause_report = suite.test_exhausting_the_budget_gives_one_root_cause_report
test_a_worker_killed_by_a_signal_is_reported_by_signal_name = (
    suite.test_a_worker_killed_by_a_signal_is_reported_by_signal_name
)
test_sigterm_is_forwarded_to_workers = suite.test_sigterm_is_forwarded_to_workers
test_an_agent_killed_with_sigkill_leaves_no_worker_behind = (
    suite.test_an_agent_killed_with_sigkill_leaves_no_worker_behind
)
test_module_mode_and_tee_filter = suite.test_module_mode_and_tee_filter
test_a_worker_stuck_past_its_watchdog_timer_is_killed_and_the_job_restarts = (
    suite.test_a_worker_stuck_past_its_watchdog_timer_is_killed_and_the_job_restarts
)
test_a_watchdog_kill_with_no_budget_fails_the_job_naming_the_scope = (
    suite.test_a_watchdog_kill_with_no_budget_fails_the_job_naming_the_scope
)
test_timeline_logs_of_every_rank_merge_into_one_chrome_trace = (
    suite.test_timeline_logs_of_every_rank_merge_into_one_chrome_trace
)

FORKED = """
import json, os, sys
imported = "torch" in sys.modules  # before this script imports anything
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
out = {"preloaded": imported, "ppid": os.getppid(), "sum": t.item()}
with open(os.path.join(sys.argv[1], f"{os.environ['RANK']}.{attempt}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
if attempt == "0" and os.environ["RANK"] == "1":
    os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_workers_and_restarted_workers_are_forked_from_one_warm_process(tmp_path: Path, how: str) -> None:
    """``--preload torch``, or ``RALLYPOINT_AGENT_PRELOAD=torch`` alone (what the scenarios above rely on)."""
    body = suite.script(tmp_path, "forked.py", FORKED)
    flag = ["--preload", "torch"] if how == "flag" else []
    result = subprocess.run(
        [
            *suite.RALLYPOINT,
            "run",
            "--nproc-per-node",
            "2",
            *flag,
            "--max-restarts",
            "1",
            "--run-id",
            "fk",
            str(body),
            ".",
        ],
        cwd=tmp_path,
        env=_base_env() if how == "flag" else _preloading_agent_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    seen = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(seen) == ["0.0", "0.1", "1.0", "1.1"]
    assert all(s["preloaded"] for s in seen.values())  # torch was there before the script's first line
    assert all(s["sum"] == 2.0 for s in seen.values())
    assert len({s["ppid"] for s in seen.values()}) == 1  # one warm process, kept across the restart
    assert "restarting the job (1 of 1 restart(s) used)" in result.stderr


def test_a_preloaded_module_that_starts_a_thread_is_refused_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "spinner.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
    )
    body = suite.script(tmp_path, "job.py", "pass\n")
    env = _base_env(PYTHONPATH=str(tmp_path))
    result = subprocess.run(
        [*suite.RALLYPOINT, "run", "--preload", "spinner", "--run-id", "spin", str(body)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "agent.preload: importing spinner started 1 thread(s)" in result.stderr
    assert "Traceback" not in result.stderr


def test_preloading_a_program_that_is_not_python_is_a_config_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [*suite.RALLYPOINT, "run", "--preload", "json", "--run-id", "prog", "true"],
        cwd=tmp_path,
        env=_base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "agent.preload" in result.stderr
    assert "needs a Python script or module" in result.stderr


KILL_WARM = """
import os, signal, sys
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(sys.argv[1], f"{os.environ['RANK']}.{attempt}"), "w") as f:
    f.write(str(os.getppid()))
if attempt == "0" and os.environ["RANK"] == "0":
    os.kill(os.getppid(), signal.SIGKILL)  # the warm process: every worker dies with it
    signal.pause()
"""


def test_a_dead_warm_process_is_replaced_and_the_job_restarts(tmp_path: Path) -> None:
    body = suite.script(tmp_path, "killwarm.py", KILL_WARM)
    result = subprocess.run(
        [*suite.RALLYPOINT, "run", "--nproc-per-node", "2", "--preload", "json", "--run-id", "kw", str(body), "."],
        cwd=tmp_path,
        env=_base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    parents = {p.name: int(p.read_text()) for p in tmp_path.glob("[01].[01]")}
    assert sorted(parents) == ["0.0", "0.1", "1.1"] or sorted(parents) == ["0.0", "0.1", "1.0", "1.1"]
    assert parents["0.1"] == parents["1.1"] != parents["0.0"]  # attempt 1 forked by a new warm process
    assert f"the warm process (pid {parents['0.0']}) ended (signal SIGKILL); starting a new one" in result.stderr
    assert "signal SIGKILL" in result.stderr  # the workers' outcome, as the agent saw it


def test_the_next_job_reuses_the_kept_warm_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--preload-keep``: the second job's workers are forked by the first job's warm process."""
    body = suite.script(tmp_path, "ppid.py", "import os, sys\nprint('PPID', os.getppid())\n")
    parents = []
    with _private_runtime(monkeypatch):
        for run_id in ("k1", "k2"):
            result = subprocess.run(
                [*suite.RALLYPOINT, "run", "--preload", "json", "--preload-keep", "1m", "--run-id", run_id, str(body)],
                cwd=tmp_path,
                env=_base_env(),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 0, result.stderr
            output = result.stdout.splitlines() + result.stderr.splitlines()
            parents += [line.split()[-1] for line in output if "PPID" in line]
        assert len(parents) == 2
        assert parents[0] == parents[1]
        assert [int(parents[0])] == [int(info["pid"]) for info in kept_servers()]


STORE_FIRST = """
import json, os, socket, sys
# before torch is imported: the store must already accept connections, on every node, rank 0's too
try:
    socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=5).close()
    listening = True
except OSError as exc:
    listening = repr(exc)
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
out = {
    "listening": listening,
    "agent_store": os.environ["TORCHELASTIC_USE_AGENT_STORE"],
    "port": os.environ["MASTER_PORT"],
    "sum": t.item(),
}
with open(os.path.join(sys.argv[1], f"{os.environ['RANK']}.{attempt}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
if attempt == "0" and os.environ["RANK"] == "2":
    os.kill(os.getpid(), 9)
"""


def test_the_store_listens_before_any_worker_starts_and_each_round_has_its_own(tmp_path: Path) -> None:
    """With torch preloaded, a fork of the warm process serves the env:// store before the workers start (#39).

    Two agents (2 and 1 workers), a restart: every worker of both attempts, on both nodes, finds
    the store listening at its first line, is told so (``TORCHELASTIC_USE_AGENT_STORE=True``, as
    under torchrun), and the restart's round has a store of its own on another port.
    """
    body = suite.script(tmp_path, "store_first.py", STORE_FIRST)
    common = suite.file_job(tmp_path, "storefirst", "2", "--max-restarts", "1")
    procs = [
        subprocess.Popen(
            [*suite.RALLYPOINT, *common, "--nproc-per-node", str(n), "--node-id", f"node{i}", str(body), "."],
            cwd=tmp_path,
            env=_preloading_agent_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, n in enumerate((2, 1))
    ]
    results = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    seen = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(seen) == ["0.0", "0.1", "1.0", "1.1", "2.0", "2.1"]
    assert {k: s["listening"] for k, s in seen.items()} == dict.fromkeys(seen, True)
    assert {s["agent_store"] for s in seen.values()} == {"True"}
    assert {s["sum"] for s in seen.values()} == {3.0}
    assert seen["0.0"]["port"] != seen["0.1"]["port"]  # a new store for the restart's round
    logs = sorted(tmp_path.rglob("store.log"))  # written by the node of worker rank 0, one per attempt
    assert [log.parent.name for log in logs] == ["attempt_0", "attempt_1"]
    assert [log.read_text().split(" on ")[0] for log in logs] == ["serving torch's env:// store"] * 2
