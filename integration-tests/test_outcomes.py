"""Truthful outcomes on every node: a finished run id, a job that failed for good, a dead heartbeat.

Several agents on loopback with the file backend, through ``rallypoint run``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_run import MEMBERSHIP, RALLYPOINT, agent_env, alive, file_job, script

MARK = """
import os, sys
with open(os.path.join(sys.argv[1], "ran.txt"), "a") as f:
    f.write(os.environ["RANK"] + "\\n")
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""

# PLEASE_FAIL (in one agent's environment): wait until the other node's worker is running (or
# has finished), then fail. Otherwise WORKER_MODE says what the worker does: "sleep" (run until
# stopped) or "finish" (exit 0 at once).
FAIL_OR_RUN = """
import os, sys, time
from rallypoint.agent.error_files import record

out = sys.argv[1]

@record
def main():
    if os.environ.get("PLEASE_FAIL"):
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(out, "other-started")):
            assert time.monotonic() < deadline, "the other node's worker never started"
            time.sleep(0.02)
        raise ValueError("planned failure for good")
    with open(os.path.join(out, "other.pid"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(out, "other.pid"), os.path.join(out, "other-started"))
    if os.environ["WORKER_MODE"] == "sleep":
        time.sleep(600)

main()
"""

SLEEP = """
import os, sys, time
with open(os.path.join(sys.argv[1], "pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(sys.argv[1], "pid.tmp"), os.path.join(sys.argv[1], "pid"))  # whole or absent
time.sleep(600)
"""


def _spawn(args: list[str], cwd: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*RALLYPOINT, *args],
        cwd=cwd,
        env=agent_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RALLYPOINT, *args], cwd=cwd, env=agent_env(**env), capture_output=True, text=True, timeout=120
    )


def _wait_for(path: Path, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _root_cause(err: str) -> str:
    lines = err.splitlines()
    return lines[lines.index("root cause (first failure of the last attempt):") + 1].strip()


def _job_file(tmp_path: Path, run_id: str, exit_with: int) -> Path:
    job = tmp_path / "job.toml"
    job.write_text(
        f'[job]\nentrypoint = "mark.py"\nargs = ["{tmp_path}"]\nenv = {{ EXIT_WITH = "{exit_with}" }}\n\n'
        f'[agent]\nmax_restarts = 0\n\n[rendezvous]\nbackend = "file"\nrun_id = "{run_id}"\n\n'
        f'[rendezvous.options]\npath = "{tmp_path / "rdzv"}"\n'
    )
    return job


@pytest.mark.parametrize("given", ["flag", "job file"])
@pytest.mark.parametrize(("exit_with", "first_code", "how"), [(0, 0, "ended"), (3, 1, "failed")])
def test_rerunning_a_finished_run_id_is_refused_and_starts_no_worker(
    tmp_path: Path, given: str, exit_with: int, first_code: int, how: str
) -> None:
    script(tmp_path, "mark.py", MARK)
    if given == "flag":
        args = [*file_job(tmp_path, "same1", "1", "--max-restarts", "0"), "mark.py", str(tmp_path)]
        env = {"EXIT_WITH": str(exit_with)}
    else:
        args, env = ["run", str(_job_file(tmp_path, "same1", exit_with))], {}
    first = _run(args, tmp_path, **env)
    assert first.returncode == first_code, first.stderr
    assert (tmp_path / "ran.txt").read_text() == "0\n"
    again = _run(args, tmp_path, **env)
    assert again.returncode == 2, again.stderr
    assert f"run id 'same1' belongs to a job that already {how}" in again.stderr
    assert "closed by node" in again.stderr
    assert "give it a new run id (--run-id ID, or rendezvous.run_id in the job file)" in again.stderr
    assert "closed by another node" not in again.stderr
    assert "Traceback" not in again.stderr
    assert (tmp_path / "ran.txt").read_text() == "0\n", "a worker ran for the finished run"
    status = _run(
        ["status", "--rdzv-backend", "file", "--rdzv-endpoint", str(tmp_path / "rdzv"), "--run-id", "same1"], tmp_path
    )
    assert status.returncode == 0, status.stderr
    assert "round:     0 (closed)" in status.stdout
    assert (
        f"ended:     job {'succeeded' if how == 'ended' else 'failed after 0 of 0 restart(s)'} (closed by node"
        in status.stdout
    )


def test_two_different_jobs_under_one_run_id_do_not_merge(tmp_path: Path) -> None:
    for name in ("train.py", "evaluate.py"):
        script(tmp_path, name, MARK)
    common = file_job(tmp_path, "clash", "2", "--nproc-per-node", "1")
    procs = [
        _spawn([*common, "--node-id", "a", "train.py", str(tmp_path)], tmp_path),
        _spawn([*common, "--node-id", "b", "evaluate.py", str(tmp_path)], tmp_path),
    ]
    try:
        deadline = time.monotonic() + 60
        while all(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, "neither job was refused"
            time.sleep(0.05)
        refused = next(p for p in procs if p.poll() is not None)
        _, err = refused.communicate(timeout=30)
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
    assert refused.returncode == 2, err
    assert "run id 'clash' is already used by a different job" in err
    assert "'train.py'" in err
    assert "'evaluate.py'" in err
    assert "Traceback" not in err
    assert not (tmp_path / "ran.txt").exists(), "the two jobs merged and ran workers"


@pytest.mark.parametrize("other", ["sleep", "finish"])
def test_a_job_that_failed_for_good_fails_on_every_node(tmp_path: Path, other: str) -> None:
    """Node a exhausts the budget; node b's running worker (or its exit barrier) stops, b exits 1."""
    script(tmp_path, "work.py", FAIL_OR_RUN)
    common = file_job(tmp_path, "fails", "2", "--nproc-per-node", "1", "--max-restarts", "0")
    common += ["--monitor-interval", "100ms"]
    b = _spawn([*common, "--node-id", "b", "work.py", str(tmp_path)], tmp_path, WORKER_MODE=other)
    a = _spawn([*common, "--node-id", "a", "work.py", str(tmp_path)], tmp_path, PLEASE_FAIL="1")
    try:
        _, a_err = a.communicate(timeout=120)
        a_done = time.monotonic()
        _, b_err = b.communicate(timeout=60)  # was: b ran on (600 s sleep, or 300 s exit barrier), then "succeeded"
        b_lag = time.monotonic() - a_done
    finally:
        a.kill()
        b.kill()
    assert a.returncode == 1, a_err
    assert b.returncode == 1, b_err
    other_pid = int((tmp_path / "other-started").read_text())
    assert not alive(other_pid), "node b's worker outlived the failed job"
    for err in (a_err, b_err):
        assert "job 'fails' failed after 0 of 0 restart(s)" in err
        assert err.count("root cause (first failure of the last attempt):") == 1
        assert "error: ValueError: planned failure for good" in err
        assert "succeeded" not in err
    assert _root_cause(a_err) == _root_cause(b_err)  # the same rank, host, exit and attempt
    assert "job failed after 0 of 0 restart(s) (closed by node 'a'); this node's workers were stopped" in b_err
    # monitor_interval (0.1 s) + one round trip, plus stopping a worker and starting Python: far
    # below the 600 s the worker (or the 300 s the exit barrier) would have taken
    assert b_lag < 30, f"node b took {b_lag:.1f}s after node a"


@pytest.mark.parametrize("damage", ["run directory deleted", "heartbeats unwritable"])
def test_a_node_whose_rendezvous_cannot_be_written_fails_and_stops_its_workers(tmp_path: Path, damage: str) -> None:
    script(tmp_path, "sleep.py", SLEEP)
    args = file_job(tmp_path, "nobeat", "1", "--nproc-per-node", "1", "--node-id", "nobeat-node")
    args += ["--set", "rendezvous.heartbeat_interval=0.1s", "--set", "rendezvous.heartbeat_timeout=0.5s"]
    args += ["--set", "rendezvous.join_timeout=3s"]  # a node that lost its heartbeat retries this long
    agent = _spawn([*args, "sleep.py", str(tmp_path)], tmp_path)
    run_dir = tmp_path / "rdzv" / "nobeat"
    try:
        _wait_for(tmp_path / "pid", "the worker did not start")
        worker = int((tmp_path / "pid").read_text())
        _wait_for(run_dir / "kv" / "hb" / "nobeat-node", "the node did not write a heartbeat")
        if damage == "run directory deleted":
            shutil.rmtree(run_dir)
        else:
            # the file backend keeps heartbeats in kv/hb/: a plain file there fails every heartbeat
            # write while the round header stays readable (root ignores permission bits)
            shutil.rmtree(run_dir / "kv" / "hb")
            (run_dir / "kv" / "hb").write_text("not a directory")
        _, err = agent.communicate(timeout=60)  # was: ran on, unwatched and silent, for the 600 s
    finally:
        agent.kill()
    assert agent.returncode == 1, err
    assert not alive(worker), "the worker outlived its failed node"
    assert "Traceback" not in err
    assert str(run_dir) in err  # the error names what failed
    if damage == "heartbeats unwritable":
        # a backend error, as when the link is down: the node stops its workers and retries for the
        # join timeout, never running them again while its heartbeat cannot be written
        assert f"its heartbeat could not reach the rendezvous ('file' backend at {tmp_path / 'rdzv'})" in err
        assert "this node fails: it could not rejoin the job" in err
        assert "round 1," not in err, err


def test_a_restarted_agent_of_a_running_job_joins_it_again(tmp_path: Path) -> None:
    """The run id guard lets the same job's node back in: same node id, same command line."""
    body = script(tmp_path, "member.py", MEMBERSHIP)
    common = file_job(
        tmp_path,
        "again",
        "2",
        "--nproc-per-node",
        "1",
        "--set",
        "rendezvous.heartbeat_interval=0.25s",
        "--set",
        "rendezvous.heartbeat_timeout=1.5s",
    )
    a = _spawn([*common, "--node-id", "a", str(body), str(tmp_path)], tmp_path)
    b = _spawn([*common, "--node-id", "b", str(body), str(tmp_path)], tmp_path)
    restarted = None
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("r0.rank*"))) < 2:
            assert time.monotonic() < deadline, "round 0 did not start two workers"
            time.sleep(0.05)
        b.kill()  # a scheduler restarts node b's agent
        b.wait(timeout=30)
        restarted = _spawn([*common, "--node-id", "b", str(body), str(tmp_path)], tmp_path)
        results = [p.communicate(timeout=120) for p in (a, restarted)]
    finally:
        for p in (a, b, restarted):
            if p is not None:
                p.kill()
    assert [a.returncode, restarted.returncode] == [0, 0], results
    later = sorted(p.name.split(".")[1] for p in tmp_path.glob("r*.rank*") if not p.name.startswith("r0."))
    assert later == ["rank0", "rank1"]
    assert "job 'again' succeeded" in results[1][1]
