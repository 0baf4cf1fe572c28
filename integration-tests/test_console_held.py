"""A console nobody reads never holds the agent: not its exit, its restarts or its signals (issue #35, item 4).

Each test runs ``rallypoint run`` with its stdout (and stderr) on a pipe that the test does not
read, so the pipe fills up (64 KiB) and stays full, as a stalled ssh session or a `less` left at
its first page would. The agent must still restart, stop on SIGTERM and exit on time; the lines
it could not show are counted in its last message, and the log files keep every byte.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]
LINES = 50_000  # per worker and stream, 100 bytes each: 5 MB, far more than a pipe holds
#: How long the agent may take for what it does in a second with a console that is read. The agent
#: under test did not do it at all (it waited for the console until the reader went away).
BOUND = 30.0

#: argv: <marks file> <what> where what is "once" (rank 0 fails on attempt 0), "fail" (the same, with
#: stdout only), "hold" (sleep after the output) or "ok" (stdout only); appends
#: "<event> <rank> <attempt> <time>" lines to the marks file.
WORKER = f"""
import os, sys, time
marks, what = sys.argv[1], sys.argv[2]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = os.environ["RANK"]

def mark(event):
    with open(marks, "a") as f:
        f.write(f"{{event}} {{rank}} {{attempt}} {{time.time()}}\\n")

mark("start")
if attempt == 0:
    lines = [b"r%s line %08d " % (rank.encode(), i) + b"x" * 80 + b"\\n" for i in range({LINES})]
    for start in range(0, len(lines), 5_000):
        sys.stdout.buffer.write(b"".join(lines[start:start + 5_000]))
        sys.stdout.flush()
        if what not in ("ok", "fail"):
            sys.stderr.buffer.write(b"".join(lines[start:start + 5_000]).replace(b"line", b"err "))
            sys.stderr.flush()
mark("wrote")
if what in ("once", "fail") and attempt == 0:  # rank 0 fails once both wrote everything; rank 1 is stopped
    while open(marks).read().count("wrote") < 2:
        time.sleep(0.02)
    if rank == "0":
        sys.exit(1)
    time.sleep(600)
if what == "hold":
    time.sleep(600)
"""


def expected(rank: int, stream: str) -> list[bytes]:
    word = b"line" if stream == "out" else b"err "
    return [b"r%d %s %08d " % (rank, word, i) + b"x" * 80 for i in range(LINES)]


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}


def start(tmp_path: Path, what: str, *flags: str) -> subprocess.Popen[bytes]:
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(WORKER))
    return subprocess.Popen(
        [
            *RALLYPOINT,
            "run",
            "--nproc-per-node",
            "2",
            "--run-id",
            "held",
            *flags,
            str(worker),
            str(tmp_path / "marks"),
            what,
        ],
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,  # never read while the job runs
        stderr=subprocess.PIPE,
    )


def marks(tmp_path: Path, event: str, attempt: int = 0) -> list[float]:
    path = tmp_path / "marks"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [float(r[3]) for r in rows if r[0] == event and int(r[2]) == attempt]


def wait_for(predicate: Callable[[], bool], what: str, agent: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert agent.poll() is None, f"the agent ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def exit_within(agent: subprocess.Popen[bytes], seconds: float, what: str) -> int:
    try:
        return agent.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the agent did not exit within {seconds:g}s of {what}: its console held it") from None


def log_lines(tmp_path: Path, attempt: int, rank: int) -> list[bytes]:
    return (tmp_path / "runs" / "held" / f"attempt_{attempt}" / f"rank_{rank}.log").read_bytes().splitlines()


def assert_logs_complete(tmp_path: Path, *, stderr: bool = True) -> None:
    for rank in (0, 1):
        lines = log_lines(tmp_path, 0, rank)
        assert [ln for ln in lines if b" line " in ln] == expected(rank, "out")
        assert [ln for ln in lines if b" err  " in ln] == (expected(rank, "err") if stderr else [])


def not_shown(stderr: str) -> int:
    found = re.findall(r"console: (\d+) line\(s\) not shown", stderr)
    assert len(found) == 1, stderr[-3000:]
    return int(found[0])


def test_the_agent_exits_with_the_job_when_its_stdout_is_not_read(tmp_path: Path) -> None:
    agent = start(tmp_path, "ok", "--max-restarts", "0")
    try:
        # stderr is read as it comes (the worker lines on it, and the agent's own messages)
        err_chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: err_chunks.append(agent.stderr.read()))  # type: ignore[union-attr]
        reader.start()
        wait_for(lambda: len(marks(tmp_path, "wrote")) == 2, "both workers wrote everything", agent)
        code = exit_within(agent, BOUND, "the job's end")
        reader.join(30)
        out = agent.stdout.read()  # type: ignore[union-attr]  # what the pipe took before it filled up
    finally:
        agent.kill()
        agent.wait()
    err = b"".join(err_chunks).decode()
    assert code == 0, err[-3000:]
    assert_logs_complete(tmp_path, stderr=False)
    shown = [ln for ln in out.splitlines() if re.fullmatch(rb"\[[^\]]+:[01]\] r[01] line \d{8} x{80}", ln)]
    assert 0 < len(shown) < 2 * LINES
    # every worker stdout line is either on the console, whole, or counted in the agent's last words
    assert len(shown) + not_shown(err) == 2 * LINES
    assert "succeeded" in err


def test_the_failure_report_counts_the_lines_the_console_did_not_show(tmp_path: Path) -> None:
    agent = start(tmp_path, "fail", "--max-restarts", "0")
    try:
        err_chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: err_chunks.append(agent.stderr.read()))  # type: ignore[union-attr]
        reader.start()
        wait_for(lambda: len(marks(tmp_path, "wrote")) == 2, "both workers wrote everything", agent)
        code = exit_within(agent, BOUND, "the job's failure")
        reader.join(30)
    finally:
        agent.kill()
        agent.wait()
    err = b"".join(err_chunks).decode()
    assert code == 1, err[-3000:]
    report = json.loads((tmp_path / "runs" / "held" / "failure.json").read_text())
    assert report["root_cause"]["rank"] == 0
    assert 0 < report["console_not_shown"] <= 2 * LINES
    assert f"console: {report['console_not_shown']} line(s) not shown here; the log files have every line" in err


def test_a_restart_is_not_held_up_by_a_console_nobody_reads(tmp_path: Path) -> None:
    agent = start(tmp_path, "once", "--max-restarts", "1")
    try:
        wait_for(lambda: len(marks(tmp_path, "wrote")) == 2, "both workers wrote everything", agent)
        failed = max(marks(tmp_path, "wrote"))
        deadline = time.monotonic() + BOUND
        while len(marks(tmp_path, "start", attempt=1)) < 2:
            assert time.monotonic() < deadline, f"no restart within {BOUND:g}s of the failure: the console held it"
            assert agent.poll() is None, "the agent ended instead of restarting"
            time.sleep(0.05)
        assert min(marks(tmp_path, "start", attempt=1)) - failed < BOUND
        code = exit_within(agent, BOUND, "the restarted job's end")
        err = agent.stderr.read().decode()  # type: ignore[union-attr]
    finally:
        agent.kill()
        agent.wait()
    assert code == 0, err[-3000:]
    assert_logs_complete(tmp_path)
    assert (tmp_path / "runs" / "held" / "attempt_1" / "rank_0.log").exists()


def test_sigterm_is_honoured_while_the_console_is_not_read(tmp_path: Path) -> None:
    agent = start(tmp_path, "hold", "--max-restarts", "0", "--set", "agent.shutdown_timeout=5s")
    try:
        wait_for(lambda: len(marks(tmp_path, "wrote")) == 2, "both workers wrote everything", agent)
        # the agent has read all of it (the log files are complete): its console is as full as it gets
        complete = lambda: all(len(log_lines(tmp_path, 0, rank)) == 2 * LINES for rank in (0, 1))  # noqa: E731
        wait_for(complete, "the logs hold every line", agent)
        agent.send_signal(signal.SIGTERM)
        code = exit_within(agent, BOUND, "SIGTERM")
        err = agent.stderr.read().decode()  # type: ignore[union-attr]
    finally:
        agent.kill()
        agent.wait()
    assert code == 128 + signal.SIGTERM
    assert_logs_complete(tmp_path)
    assert err.startswith("[rallypoint ")  # what the pipe took before it filled up


HEAD_WORKER = """
import os, sys, time
print(f"first line of rank {os.environ['RANK']}", flush=True)
while not os.path.exists(sys.argv[1]):  # the console's reader is gone
    time.sleep(0.02)
for i in range(2000):
    print(f"more {i} of rank {os.environ['RANK']}")
"""


def test_a_console_closed_by_its_reader_does_not_fail_a_job_that_succeeded(tmp_path: Path) -> None:
    """``rallypoint run ... 2>&1 | head -1``: the exit status is the job's."""
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(HEAD_WORKER))
    gone = tmp_path / "gone"
    agent = subprocess.Popen(
        [*RALLYPOINT, "run", "--nproc-per-node", "2", "--run-id", "head", str(worker), str(gone)],
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert agent.stdout is not None
        first = agent.stdout.readline()  # what `head -1` keeps
        agent.stdout.close()  # ... and then it exits
        gone.touch()
        code = exit_within(agent, BOUND, "the job's end")
    finally:
        agent.kill()
        agent.wait()
    assert first
    assert code == 0
    for rank in (0, 1):
        log = (tmp_path / "runs" / "head" / "attempt_0" / f"rank_{rank}.log").read_text().splitlines()
        assert log == [f"first line of rank {rank}", *(f"more {i} of rank {rank}" for i in range(2000))]
