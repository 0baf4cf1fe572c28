"""The worker-code examples of issue #18, run as users run them: through ``rallypoint run``.

* ``examples/timeouts/barrier_handler.py``: a barrier with a process-wide timeout handler that
  waits once more for a straggler, then gives up and ends the worker;
* ``examples/timeouts/recv_deadline.py``: rank 0 receives from every rank under one Deadline;
* ``examples/timeline/timeline_client.py``: a TimelineClient with nested events and callbacks,
  and the global timeline, on one host and across two namespace hosts (each with its own
  working directory and log directory, so the timeline can only come through the job's store).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import netns
from test_multihost import agent_env, wait_joined

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CLI = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]


def rallypoint_run(args: list[str], cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [*CLI, "run", *args], cwd=cwd, env=agent_env(), capture_output=True, text=True, timeout=timeout
    )


def rank_log(cwd: Path, rank: int) -> str:
    (log,) = cwd.glob(f"runs/*/attempt_0/rank_{rank}.log")
    return log.read_text()


def failure(cwd: Path) -> dict[str, object]:
    (report,) = cwd.glob("runs/*/failure.json")
    data: dict[str, object] = json.loads(report.read_text())
    return data


def test_barrier_handler_waits_once_more_for_a_straggler(tmp_path: Path) -> None:
    straggle = 'job.args=["--straggler", "1", "--delay", "3", "--grace", "30"]'  # a plain barrier()
    job = ["--set", "collectives.timeout=2s", "--set", straggle, str(EXAMPLES / "timeouts" / "job.toml")]
    done = rallypoint_run(job, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rank0 = rank_log(tmp_path, 0)
    assert "rank 0: barrier on WORLD: rank(s) 1 not there after" in rank0, rank0
    assert "(timeout 2s)" in rank0  # the job's timeout
    assert "rank 0: waiting 30s more for them" in rank0
    assert "rank 0: all 2 ranks passed the barrier" in rank0
    assert "rank 1: all 2 ranks passed the barrier" in rank_log(tmp_path, 1)


def test_barrier_handler_gives_up_and_ends_the_worker(tmp_path: Path) -> None:
    stuck = 'job.args=["--straggler", "1", "--delay", "600", "--timeout", "1", "--grace", "1"]'
    done = rallypoint_run(["--set", stuck, str(EXAMPLES / "timeouts" / "job.toml")], tmp_path)
    assert done.returncode != 0
    root = failure(tmp_path)["root_cause"]
    assert isinstance(root, dict)
    assert (root["rank"], root["exit_code"]) == (0, 1), root
    rank0 = rank_log(tmp_path, 0)
    assert "rank 0: waiting 1s more for them" in rank0, rank0
    assert (
        "rank 0: giving up: barrier on WORLD (ranks 0-1) timed out after 2s on rank 0: rank 1 did not arrive" in rank0
    )


def test_receive_loop_under_one_deadline(tmp_path: Path) -> None:
    script = str(EXAMPLES / "timeouts" / "recv_deadline.py")
    common = ["--nproc-per-node", "3", "--max-restarts", "0", "--set", "collectives.backend=gloo"]
    done = rallypoint_run([*common, script, "--budget", "30"], tmp_path / "ok")
    assert done.returncode == 0, done.stdout + done.stderr
    rank0 = rank_log(tmp_path / "ok", 0)
    assert "rank 0: got 10 from rank 1" in rank0
    assert "rank 0: got 20 from rank 2" in rank0
    assert "rank 0: received from ranks [1, 2]; budget spent: False" in rank0

    spent = rallypoint_run([*common, script, "--budget", "5", "--silent", "2"], tmp_path / "spent")
    assert spent.returncode != 0
    rank0 = rank_log(tmp_path / "spent", 0)
    assert "rank 0: got 10 from rank 1" in rank0
    assert "rank 2 did not arrive" in rank0
    assert "deadline of 5s shared by 2 wait(s): recv from rank 1 " in rank0, rank0
    assert "recv from rank 2 " in rank0
    assert "(ran out)" in rank0
    assert "rank 0: received from ranks [1]; budget spent: True" in rank0


def _summary(output: str) -> dict[str, object]:
    (line,) = [x for x in output.splitlines() if "TIMELINE " in x]
    data: dict[str, object] = json.loads(line.split("TIMELINE ", 1)[1])
    return data


def _spans(ranks: range, steps: int) -> list[list[object]]:
    names = ("all_reduce", "backward", "forward", "step")
    return sorted([f"{r}:{n}", steps] for r in ranks for n in names)


def test_timeline_client_example_on_one_host(tmp_path: Path) -> None:
    done = rallypoint_run([str(EXAMPLES / "timeline" / "job.toml")], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = _summary(rank_log(tmp_path, 0))
    assert summary["ranks"] == [0, 1]
    # the job file's timeline_config excludes debug* events: the callbacks never saw them either
    assert summary["spans"] == _spans(range(2), 3)
    assert summary["callbacks"] == {"started": 12, "ended": 12}
    assert summary["offsets_known"] is True
    assert summary["log"] == "timer_events.rank0.log"
    begins = [json.loads(x) for x in (tmp_path / "timer_events.rank1.log").read_text().splitlines()]
    assert {"step": 2} in [b.get("args") for b in begins if b["t"] == "B" and b["name"] == "step"]
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}


def test_timeline_client_gathers_every_rank_across_two_hosts(
    hosts: Callable[..., netns.HostNetwork], tmp_path: Path
) -> None:
    net = hosts(2)
    run_id = f"tl-{tmp_path.name}"
    args = 'job.args=["--steps", "2", "--log", "timer_events.log", "--summary", "summary"]'
    procs = []
    for i, host in enumerate(net.hosts):
        wait_joined(tmp_path, run_id, i)
        cwd = tmp_path / host.name  # nothing shared but the rendezvous directory
        cwd.mkdir()
        argv = [*CLI, "run", "--nnodes", "2", "--rdzv-backend", "file", "--rdzv-endpoint", str(tmp_path / "rdzv")]
        argv += ["--run-id", run_id, "--local-addr", host.addr, "--set", args, str(EXAMPLES / "timeline" / "job.toml")]
        procs.append(
            host.popen(argv, cwd=cwd, env=agent_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        outputs.append(out)
        assert proc.returncode == 0, out[-4000:]
    summaries = {}
    for host in net.hosts:
        for path in (tmp_path / host.name / "summary").glob("rank*.json"):
            data = json.loads(path.read_text())
            summaries[data["rank"]] = data
            assert data["host"] == host.name
            own = sorted(p.name for p in (tmp_path / host.name).glob("timer_events.rank*.log"))
            assert f"timer_events.rank{data['rank']}.log" in own  # each host keeps its own logs
    assert sorted(summaries) == [0, 1, 2, 3]
    for data in summaries.values():  # every rank got every rank of both hosts
        assert data["ranks"] == [0, 1, 2, 3], data
        assert data["hosts"] == ["nodea", "nodeb"], data
        assert data["spans"] == _spans(range(4), 2), data
        assert data["offsets_known"] is True
    assert os.environ.get("RALLYPOINT_TIMELINE_FILE") is None
