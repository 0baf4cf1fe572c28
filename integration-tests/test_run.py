"""Whole jobs through ``rallypoint run``: real agents, real workers, real gloo collectives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

ENV_CHECK = """
import json, os, sys
import torch
import torch.distributed as dist

NAMES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
         "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
         "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS"]
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
out = {name: os.environ.get(name) for name in NAMES}
out["sum"] = t.item()
out["init_world"] = dist.get_world_size()
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""

CRASH_UNTIL = """
import os, sys, time
from rallypoint.agent.error_files import record

@record
def main():
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    path = os.path.join(sys.argv[2], f"rank{rank}.attempt{attempt}")
    with open(path + ".tmp", "w") as f:
        f.write(os.environ["WORLD_SIZE"])
    os.replace(path + ".tmp", path)
    if rank == 1 and attempt < int(sys.argv[1]):
        # fail only once rank 0 has written its file: the agent stops rank 0 when rank 1 fails
        deadline = time.monotonic() + 60
        rank0 = os.path.join(sys.argv[2], f"rank0.attempt{attempt}")
        while not os.path.exists(rank0) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise ValueError(f"planned failure on attempt {attempt}")

main()
"""

SLEEPER = """
import os, signal, sys, time
out = sys.argv[1]
rank = os.environ["RANK"]
def on_term(signum, frame):
    with open(os.path.join(out, f"term{rank}"), "w") as f:
        f.write("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(out, f"pid{rank}.tmp"), "w") as f:  # renamed once written: never seen empty
    f.write(str(os.getpid()))
os.replace(os.path.join(out, f"pid{rank}.tmp"), os.path.join(out, f"pid{rank}"))
time.sleep(120)
"""


def run(args: list[str], cwd: Path, timeout: float = 120, **kw) -> subprocess.CompletedProcess[str]:
    env = agent_env()
    return subprocess.run([*RALLYPOINT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def agent_env(**extra: str) -> dict[str, str]:
    """This process's environment without RALLYPOINT_* overrides, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    env.update(extra)
    return env


def file_job(tmp_path: Path, run_id: str, nnodes: str, *extra: str) -> list[str]:
    """``rallypoint run`` arguments for a multi-node job on loopback with the file backend."""
    return [
        "run",
        "--nnodes",
        nnodes,
        "--rdzv-backend",
        "file",
        "--rdzv-endpoint",
        str(tmp_path / "rdzv"),
        "--run-id",
        run_id,
        "--local-addr",
        "127.0.0.1",
        *extra,
    ]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except ProcessLookupError:  # reaped while its stat was read
        return False
    except FileNotFoundError:  # reaped since os.kill, or no /proc here (then os.kill is all there is)
        return not Path("/proc/self").exists()
    return state != "Z"


def test_a_torchrun_script_runs_unmodified_with_the_full_environment(tmp_path: Path) -> None:
    check = script(tmp_path, "check.py", ENV_CHECK)
    result = run(["run", "--nproc-per-node", "2", "--run-id", "envjob", str(check), str(tmp_path)], tmp_path)
    assert result.returncode == 0, result.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    torch_preloaded = "torch" in agent_env().get("RALLYPOINT_AGENT_PRELOAD", "").split(",")
    for rank, seen in enumerate(ranks):
        assert seen["RANK"] == str(rank)
        assert seen["LOCAL_RANK"] == str(rank)
        assert seen["WORLD_SIZE"] == "2"
        assert seen["LOCAL_WORLD_SIZE"] == "2"
        assert seen["GROUP_RANK"] == "0"
        assert seen["GROUP_WORLD_SIZE"] == "1"
        assert seen["ROLE_RANK"] == str(rank)
        assert seen["ROLE_NAME"] == "default"
        assert seen["ROLE_WORLD_SIZE"] == "2"
        assert seen["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert seen["TORCHELASTIC_MAX_RESTARTS"] == "3"
        assert seen["TORCHELASTIC_RUN_ID"] == "envjob"
        # a warm process that preloads torch serves the store (test_warm.py runs this with torch preloaded)
        assert seen["TORCHELASTIC_USE_AGENT_STORE"] == str(torch_preloaded)
        assert seen["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/rank_{rank}.error.json")
        assert seen["OMP_NUM_THREADS"] == "1"
        assert seen["sum"] == 3.0
        assert seen["init_world"] == 2
    assert ranks[0]["MASTER_ADDR"] == ranks[1]["MASTER_ADDR"] == "127.0.0.1"
    assert ranks[0]["MASTER_PORT"] == ranks[1]["MASTER_PORT"]
    # console lines carry the [host:rank] prefix; logs are kept per attempt and rank
    assert (tmp_path / "runs" / "envjob" / "attempt_0" / "rank_1.log").exists()


def test_a_crashing_worker_is_restarted_and_the_job_succeeds(tmp_path: Path) -> None:
    crash = script(tmp_path, "crash.py", CRASH_UNTIL)
    result = run(
        ["run", "--nproc-per-node", "2", "--max-restarts", "3", "--run-id", "r1", str(crash), "2", str(tmp_path)],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    # attempts 0 and 1 failed on rank 1, attempt 2 succeeded; every rank saw every attempt
    for attempt in range(3):
        for rank in range(2):
            assert (tmp_path / f"rank{rank}.attempt{attempt}").read_text() == "2"
    assert not (tmp_path / "rank0.attempt3").exists()
    assert "restarting the job (2 of 3 restart(s) used)" in result.stderr
    assert "job 'r1' succeeded" in result.stderr


def test_exhausting_the_budget_gives_one_root_cause_report(tmp_path: Path) -> None:
    crash = script(tmp_path, "crash.py", CRASH_UNTIL)
    result = run(
        ["run", "--nproc-per-node", "2", "--max-restarts", "1", "--run-id", "r2", str(crash), "9", str(tmp_path)],
        tmp_path,
    )
    assert result.returncode == 1
    assert "job 'r2' failed after 1 of 1 restart(s)" in result.stderr
    assert result.stderr.count("root cause (first failure of the last attempt):") == 1
    assert "rank 1 (local 1) on" in result.stderr
    assert "error: ValueError: planned failure on attempt 1" in result.stderr
    assert 'raise ValueError(f"planned failure on attempt {attempt}")' in result.stderr
    report = json.loads((tmp_path / "runs" / "r2" / "failure.json").read_text())
    root = report["root_cause"]
    assert (root["rank"], root["exit_code"], root["attempt"]) == (1, 1, 1)
    assert root["exception"] == "ValueError: planned failure on attempt 1"
    assert "planned failure" in root["traceback"]
    assert [f["attempt"] for f in report["failures"]] == [1, 0]


def test_a_worker_killed_by_a_signal_is_reported_by_signal_name(tmp_path: Path) -> None:
    killer = script(
        tmp_path,
        "killer.py",
        "import os, signal\nif os.environ['RANK'] == '0':\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    )
    result = run(["run", "--nproc-per-node", "2", "--max-restarts", "0", "--run-id", "sig", str(killer)], tmp_path)
    assert result.returncode == 1
    assert "rank 0 (local 0) on" in result.stderr
    assert "signal SIGKILL" in result.stderr


def test_sigterm_is_forwarded_to_workers(tmp_path: Path) -> None:
    sleeper = script(tmp_path, "sleeper.py", SLEEPER)
    env = agent_env()
    agent = subprocess.Popen(
        [*RALLYPOINT, "run", "--nproc-per-node", "2", "--run-id", "term", str(sleeper), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.05)
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    finally:
        agent.kill()
    assert agent.returncode == 128 + signal.SIGTERM, err
    assert "received SIGTERM; stopping workers" in err
    for rank in range(2):
        assert (tmp_path / f"term{rank}").read_text() == "SIGTERM"


def test_an_agent_killed_with_sigkill_leaves_no_worker_behind(tmp_path: Path) -> None:
    sleeper = script(tmp_path, "sleeper.py", SLEEPER)
    env = agent_env()
    agent = subprocess.Popen(
        [*RALLYPOINT, "run", "--nproc-per-node", "2", "--run-id", "orphans", str(sleeper), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.05)
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
        assert all(alive(p) for p in pids)
        agent.kill()
        agent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids), "workers outlived their agent"
    finally:
        agent.kill()


def test_two_jobs_on_one_host_neither_collide_nor_merge(tmp_path: Path) -> None:
    check = script(tmp_path, "check.py", ENV_CHECK)
    env = agent_env()
    outs = [tmp_path / "a", tmp_path / "b"]
    procs = []
    for out in outs:
        out.mkdir()
        procs.append(
            subprocess.Popen(
                [*RALLYPOINT, "run", "--nproc-per-node", "2", str(check), str(out)],
                cwd=out,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    seen = [[json.loads((out / f"rank{r}.json").read_text()) for r in range(2)] for out in outs]
    for job in seen:
        assert [s["sum"] for s in job] == [3.0, 3.0]  # two workers each, not four
        assert {s["TORCHELASTIC_RUN_ID"] for s in job} != set()
    assert seen[0][0]["MASTER_PORT"] != seen[1][0]["MASTER_PORT"]
    assert seen[0][0]["TORCHELASTIC_RUN_ID"] != seen[1][0]["TORCHELASTIC_RUN_ID"]


def test_two_agents_on_loopback_with_the_file_backend(tmp_path: Path) -> None:
    check = script(tmp_path, "check.py", ENV_CHECK)
    env = agent_env()
    common = file_job(tmp_path, "two", "2")
    procs = [
        subprocess.Popen(
            [*RALLYPOINT, *common, "--nproc-per-node", str(n), "--node-id", f"node{i}", str(check), str(tmp_path)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, n in enumerate((2, 1))
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert [s["sum"] for s in seen] == [6.0, 6.0, 6.0]
    assert {s["WORLD_SIZE"] for s in seen} == {"3"}
    assert {s["GROUP_WORLD_SIZE"] for s in seen} == {"2"}
    by_group = sorted((s["GROUP_RANK"], s["LOCAL_WORLD_SIZE"]) for s in seen)
    assert by_group in ([("0", "1"), ("1", "2"), ("1", "2")], [("0", "2"), ("0", "2"), ("1", "1")])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run"], "nothing to run: give SCRIPT [ARGS...]"),
        (["run", "--nnodes", "2", "x.py"], "backend 'memory' only works within one agent process"),
        (
            ["run", "--nnodes", "2", "--rdzv-backend", "file", "--rdzv-endpoint", "d", "x.py"],
            "a multi-node job needs a run id that every node shares",
        ),
        (["run", "--nnodes", "two", "x.py"], "--nnodes (command line): nodes: expected N or MIN:MAX, got 'two'"),
        (["run", "--rdzv-backend", "etdc", "x.py"], "unknown rendezvous backend 'etdc'"),
        (["run", "missing.py"], "no such script: missing.py"),
        (["run", "job.toml", "--max-restarts", "0"], "--max-restarts: options go before the job file and the script"),
    ],
)
def test_usage_and_config_errors_exit_2_without_traceback(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "x.py").write_text("pass\n")
    result = run(args, tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


MEMBERSHIP = """
import json, os, sys, time
out = sys.argv[1]
rnd = int(os.environ["RALLYPOINT_ROUND"])
rank = os.environ["RANK"]
with open(os.path.join(out, f"r{rnd}.rank{rank}.{os.getpid()}"), "w") as f:
    json.dump({k: os.environ[k] for k in ("WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")}, f)
if rnd == 0:
    time.sleep(600)  # the first round runs until a node dies (or a node joins)
"""


def test_a_dead_agent_makes_the_survivors_re_rendezvous_and_finish(tmp_path: Path) -> None:
    """R3: SIGKILL one agent of three (min 2): no orphans, the others notice, regroup and finish."""
    body = script(tmp_path, "member.py", MEMBERSHIP)
    env = agent_env()
    common = file_job(
        tmp_path,
        "r3",
        "2:3",
        "--nproc-per-node",
        "1",
        "--set",
        "rendezvous.heartbeat_interval=0.25s",
        "--set",
        "rendezvous.heartbeat_timeout=1.5s",
        "--set",
        "rendezvous.last_call_timeout=1s",
    )
    agents = [
        subprocess.Popen(
            [*RALLYPOINT, *common, "--node-id", f"n{i}", str(body), str(tmp_path)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("r0.rank*"))) < 3:
            assert time.monotonic() < deadline, "round 0 did not start three workers"
            time.sleep(0.05)
        victim_pid = next(int(p.name.split(".")[-1]) for p in tmp_path.glob("r0.rank2.*"))
        killed_at = time.monotonic()
        victim = next(a for a in agents if a.pid in _ancestors(victim_pid))
        victim.kill()
        survivors = [a for a in agents if a is not victim]
        results = [a.communicate(timeout=120) for a in survivors]
        elapsed = time.monotonic() - killed_at
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in survivors] == [0, 0], results
    assert not alive(victim_pid), "the dead agent's worker survived it"
    later = sorted(p.name for p in tmp_path.glob("r*.rank*") if not p.name.startswith("r0."))
    assert len(later) == 2, later
    for name in later:
        seen = json.loads((tmp_path / name).read_text())
        assert seen == {"WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0"}
    # heartbeat_timeout (1.5 s) + 1 s to notice, a rendezvous and two short worker runs take a
    # few seconds; the bound leaves room for a loaded machine and is still far below the 600 s
    # the round-0 workers would have run had the survivors not noticed the death
    assert elapsed < 60, f"survivors took {elapsed:.1f}s"


def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        out.add(pid)
    return out


def test_a_late_node_grows_the_job_without_spending_restarts(tmp_path: Path) -> None:
    body = script(tmp_path, "member.py", MEMBERSHIP)
    env = agent_env()
    common = file_job(
        tmp_path,
        "grow",
        "1:2",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "0",
        "--set",
        "rendezvous.last_call_timeout=0.5s",
    )
    first = subprocess.Popen(
        [*RALLYPOINT, *common, "--node-id", "a", str(body), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    second = None
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("r0.rank0.*")):
            assert time.monotonic() < deadline, "the first node did not start"
            time.sleep(0.05)
        second = subprocess.Popen(
            [*RALLYPOINT, *common, "--node-id", "b", str(body), str(tmp_path)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        results = [p.communicate(timeout=60) for p in (first, second)]
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert [first.returncode, second.returncode] == [0, 0], results
    assert "membership changed" in results[0][1]
    grown = sorted(p.name.split(".")[1] for p in tmp_path.glob("r1.rank*"))
    assert grown == ["rank0", "rank1"]
    for path in tmp_path.glob("r1.rank*"):
        assert json.loads(path.read_text())["WORLD_SIZE"] == "2"


def test_module_mode_and_tee_filter(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hello.py").write_text("import os, sys\nprint('hello from', os.environ['RANK'], sys.argv[1:])\n")
    env = agent_env()
    env["PYTHONPATH"] = str(tmp_path)
    result = subprocess.run(
        [*RALLYPOINT, "run", "--nproc-per-node", "3", "--tee", "rank0", "--run-id", "mod", "-m", "mypkg.hello", "--x"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "hello from 0 ['--x']" in result.stdout
    assert "hello from 1" not in result.stdout  # filtered from the console...
    log = tmp_path / "runs" / "mod" / "attempt_0" / "rank_1.log"
    assert "hello from 1 ['--x']" in log.read_text()  # ...but kept in its log file


STUCK = """
import os, sys, time
from rallypoint.timer import expires

if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    with expires(after=0.5, scope="data_load"):
        time.sleep(600)  # stuck: the watchdog must kill it
with open(os.path.join(sys.argv[1], "done" + os.environ["RANK"] + "." + os.environ["TORCHELASTIC_RESTART_COUNT"]), "w"):
    pass
"""


@pytest.mark.parametrize("backend", ["file", "local"])
def test_a_worker_stuck_past_its_watchdog_timer_is_killed_and_the_job_restarts(tmp_path: Path, backend: str) -> None:
    stuck = script(tmp_path, "stuck.py", STUCK)
    started = time.monotonic()
    result = run(
        [
            "run",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--run-id",
            f"wd-{backend}",
            "--set",
            f"timer.watchdog={backend}",
            str(stuck),
            str(tmp_path),
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 100  # killed by its 0.5 s timer, not after its 600 s sleep
    assert "watchdog timer 'data_load' expired" in result.stderr
    assert "worker rank 1 (local 1) on" in result.stderr
    assert sorted(p.name for p in tmp_path.glob("done*")) == ["done0.0", "done0.1", "done1.1"]


def test_a_watchdog_kill_with_no_budget_fails_the_job_naming_the_scope(tmp_path: Path) -> None:
    stuck = script(tmp_path, "stuck.py", STUCK)
    result = run(
        [
            "run",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "0",
            "--run-id",
            "wd0",
            "--set",
            "timer.watchdog=file",
            str(stuck),
            str(tmp_path),
        ],
        tmp_path,
    )
    assert result.returncode == 1
    report = json.loads((tmp_path / "runs" / "wd0" / "failure.json").read_text())
    assert report["root_cause"]["rank"] == 1
    assert report["root_cause"]["signal"] == "SIGKILL"
    assert report["root_cause"]["reason"].startswith("watchdog timer 'data_load' expired")


TIMELINE = """
import os, time
from rallypoint.timer import event

for step in range(3):
    with event("step", step=step):
        with event("compute"):
            time.sleep(0.01 * (1 + int(os.environ["RANK"])))
"""


def test_timeline_logs_of_every_rank_merge_into_one_chrome_trace(tmp_path: Path) -> None:
    body = script(tmp_path, "tl.py", TIMELINE)
    result = run(
        ["run", "--nproc-per-node", "2", "--run-id", "tl", "--set", "timer.timeline=true", str(body)], tmp_path
    )
    assert result.returncode == 0, result.stderr
    logs = sorted(p.name for p in (tmp_path / "runs" / "tl" / "attempt_0" / "timeline").iterdir())
    assert logs == ["rank_0.jsonl", "rank_1.jsonl"]
    merged = run(["timeline", "merge", "runs/tl", "-o", "trace.json"], tmp_path)
    assert merged.returncode == 0, merged.stderr
    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    steps = [e for e in events if e.get("name") == "step" and e.get("ph") == "X"]
    assert sorted(e["pid"] for e in steps) == [0, 0, 0, 1, 1, 1]  # one trace process per rank
    assert all(e["dur"] > 0 for e in steps)
