"""``rallypoint debug stacks`` on hung jobs (issue #40): each hang diagnosed with rank, host and frame.

The jobs run ``hang_scripts/hang.py``, a plain torch.distributed script (no rallypoint import, as
a torchrun user would write it): rank 1 misbehaves after three all_reduce calls, the others wait
in the fourth. The command runs from the test process, which reaches the job only through its
file rendezvous backend.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ddp_jobs import clean_env
from hung_jobs import CLI, HungJob, line_of


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[list[HungJob]]:
    made: list[HungJob] = []
    yield made
    for job in made:
        job.stop()


EXPECTED = {
    # rank 1's part of the diagnosis line, after "rank 1 (host H, pid P) "
    "python_sleep": f"never entered it: wait_for_batch_python at hang.py:{line_of('sum(range(1000))')}",
    "queue": f"never entered it: wait <- hang.py:{line_of('return q.get()')}",
    "socket": f"never entered it: read_from_socket at hang.py:{line_of('return a.recv(1)')} [S in the kernel: ",
    "all_gather": "called all_gather #3 (group default, float32[4]) instead (mismatched op)",
    "shape": "entered it with all_reduce #3 (group default, float32[2]) (mismatched dtype or shape)",
}


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_debug_stacks_names_the_hung_rank_its_host_and_its_frame(
    mode: str, tmp_path: Path, jobs: list[HungJob]
) -> None:
    job = HungJob(tmp_path, mode, nproc=3)
    jobs.append(job)
    job.wait_ready()
    done, took = job.stacks()
    assert done.returncode == 0, done.stdout + done.stderr
    assert took < 5.0, f"debug stacks took {took:.1f}s"
    lines = done.stdout.splitlines()
    diagnosis = next(line for line in lines if line.startswith("diagnosis:"))
    assert diagnosis.startswith("diagnosis: ranks 0, 2 wait in all_reduce #3 (group default, float32[4]); rank 1 ")
    host = os.uname().nodename
    assert f"rank 1 (host {host}, pid " in diagnosis
    assert EXPECTED[mode] in diagnosis, done.stdout
    others = 3
    if mode == "shape":  # rank 1 went on to the next all_reduce, from the same line: one stack for all
        assert lines[0].startswith(f"ranks 0-2: all_reduce <- hang.py:{line_of('# the fourth')}")
    else:  # the odd one comes first, with its host and pid; the two waiting ranks are folded into one
        assert lines[0].startswith("rank 1: "), done.stdout
        assert f"({host} pid " in lines[0], done.stdout
        assert any(line.startswith("ranks 0, 2: all_reduce <- hang.py:") for line in lines), done.stdout
        others = 2
    # every Python thread is reported, not only the main one (the prefetch thread of each rank)
    assert f"    + {others} other thread(s): wait <- hang.py:{line_of('stop.wait()')}" in lines, done.stdout


def test_debug_stacks_across_three_hosts_from_outside_the_job(hosts, tmp_path: Path, jobs: list[HungJob]) -> None:
    net = hosts(3)
    job = HungJob(tmp_path, "socket", nproc=2, hosts=net.hosts)
    jobs.append(job)
    job.wait_ready()
    done, took = job.stacks("--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert took < 5.0, f"debug stacks took {took:.1f}s"
    doc = json.loads(done.stdout)
    print(f"debug stacks, 3 hosts x 2 workers: {took:.2f}s for the command, {doc['seconds']}s request to answers")
    workers = {w["rank"]: w for w in doc["workers"]}
    assert sorted(workers) == list(range(6))
    assert {w["host"] for w in workers.values()} == {h.name for h in net.hosts}
    assert all(w["dumped"] and w["threads"] for w in workers.values())  # the socket reader answered too
    assert workers[1]["flight"][-1]["op"] == "all_reduce"
    assert workers[1]["flight"][-1]["seq"] == 2
    text, took = job.stacks()
    diagnosis = next(line for line in text.stdout.splitlines() if line.startswith("diagnosis:"))
    host = workers[1]["host"]
    assert diagnosis.startswith("diagnosis: ranks 0, 2-5 wait in all_reduce #3"), text.stdout
    assert f"rank 1 (host {host}, pid {workers[1]['pid']}) never entered it: read_from_socket at hang.py:" in diagnosis
    assert took < 5.0


def test_a_watchdog_expiry_gathers_the_report_on_every_host_before_the_kill(
    hosts, tmp_path: Path, jobs: list[HungJob]
) -> None:
    net = hosts(3)
    extra = ("--set", "timer.watchdog=file", "--set", "rendezvous.heartbeat_timeout=60s")  # a loaded machine
    job = HungJob(tmp_path, "watchdog", nproc=1, hosts=net.hosts, extra=extra)
    jobs.append(job)
    codes = [p.wait(120) for p in job.procs]
    out = job.output()
    assert codes == [1, 1, 1], out
    # one worker per host, ranks in the order the nodes joined
    rank1_host = next(h.name for h, o in zip(net.hosts, job.outs, strict=True) if "runs ranks [1]" in o.read_text())
    expected = (
        f"diagnosis: ranks 0, 2 wait in all_reduce #3 (group default, float32[4]); rank 1 (host {rank1_host}, pid "
    )
    frame = f"never entered it: wait <- hang.py:{line_of('return q.get()')}"
    for n in range(3):
        agent = job.outs[n].read_text()
        # the failure report every node prints names the watchdog scope and carries the diagnosis
        report = agent[agent.index("root cause") :]
        assert "watchdog timer 'data_load' expired" in report, agent
        assert f"hang {expected}" in report, agent
        assert frame in report, agent
        failure = json.loads((tmp_path / f"logs{n}" / "failure.json").read_text())
        assert expected in failure["root_cause"]["reason"]
        kept = (tmp_path / f"logs{n}" / "hang_report.txt").read_text()  # next to failure.json, on every node
        assert "watchdog timer 'data_load'" in kept.splitlines()[0]
        assert expected in kept
        assert frame in kept


def test_the_agent_dumps_its_own_threads_on_the_workers_signal(tmp_path: Path) -> None:
    """``kill -s RTMIN+5 <agent pid>``: where an agent that does not end waits, in its log directory."""
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    argv = [*CLI, "run", "--run-id", "agent-stacks", "--node-id", "n0", "--log-dir", str(tmp_path / "logs")]
    agent = subprocess.Popen(
        [*argv, str(script)], cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert agent.stdout is not None
        for line in agent.stdout:
            if "started" in line:
                break
        dump = tmp_path / "logs" / "agent_n0.stacks"
        assert dump.read_text().startswith(f"# rallypoint agent stacks pid={agent.pid}\n")
        assert stat_mode(dump) == 0o600  # private, as the logs
        agent.send_signal(signal.SIGRTMIN + 5)
        deadline = time.monotonic() + 10
        while "_monitor" not in dump.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = dump.read_text()
        assert "_monitor" in text, text  # the main thread, watching the workers
        assert "in _serve" in text, text  # and every other thread: the debug service's, the log pumps'
        assert "in _pump" in text, text
        assert agent.poll() is None  # only a dump: the agent and its worker go on
    finally:
        agent.terminate()
        agent.wait(30)


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.mark.parametrize(("mode", "op"), [("p2p_recv", "recv"), ("p2p_batch", "irecv")])
def test_debug_stacks_names_the_rank_that_never_sent_what_another_waits_to_receive(
    mode: str, op: str, tmp_path: Path, jobs: list[HungJob]
) -> None:
    """A point-to-point hang (#40): rank 2 waits in a receive from rank 1, which is in its data loader."""
    job = HungJob(tmp_path, mode, nproc=3)
    jobs.append(job)
    job.wait_ready()
    done, took = job.stacks("--json")
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {w["rank"]: w for w in json.loads(done.stdout)["workers"]}
    sent = workers[0]["flight"][-2]  # before the fourth all_reduce: its send to rank 1, complete
    assert (sent["op"], sent["peer"], sent["tag"], sent["bytes"]) == ({"recv": "send"}.get(op, "isend"), 1, 0, 16)
    assert isinstance(sent["end"], float)
    waiting = workers[2]["flight"][-1]
    assert (waiting["op"], waiting["seq"], waiting["peer"], waiting["end"]) == (op, 0, 1, None)
    text, took = job.stacks()
    assert took < 5.0, f"debug stacks took {took:.1f}s"
    diagnosis = next(line for line in text.stdout.splitlines() if line.startswith("diagnosis:"))
    host = os.uname().nodename
    expected = (
        f"rank 2 waits in {op} #0 from rank 1 (group default, tag 0, float32[4], 16 bytes): "
        f"rank 1 (host {host}, pid {workers[1]['pid']}) never sent it: wait <- hang.py:{line_of('return q.get()')}"
    )
    assert expected in diagnosis, text.stdout
    assert diagnosis.startswith("diagnosis: rank 0 waits in all_reduce #3 (group default, float32[4]); "), text.stdout
