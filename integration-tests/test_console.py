"""A console nobody reads never stalls the job, and the log files stay complete (issue #11, item 6; #35, item 4)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]
LINES = 200_000  # 100 bytes each: 20 MB

#: argv: <done marker> <exit|crash>; writes LINES numbered lines to stdout, then the marker.
CHATTY = f"""
import os, signal, sys, time
lines = [b"line %08d " % i + b"x" * 82 + b"\\n" for i in range({LINES})]
for start in range(0, len(lines), 10_000):
    sys.stdout.buffer.write(b"".join(lines[start:start + 10_000]))
sys.stdout.flush()
open(sys.argv[1], "w").close()
if sys.argv[2] == "crash":
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def expected() -> bytes:
    return b"".join(b"line %08d " % i + b"x" * 82 + b"\n" for i in range(LINES))


@pytest.mark.parametrize("end", ["exit", "crash"])
def test_a_console_nobody_reads_neither_stalls_the_worker_nor_loses_log_lines(tmp_path: Path, end: str) -> None:
    chatty = tmp_path / "chatty.py"
    chatty.write_text(textwrap.dedent(CHATTY))
    done = tmp_path / "done"
    run_id = f"console-{end}"
    agent = subprocess.Popen(
        [
            *RALLYPOINT,
            "run",
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "0",
            "--run-id",
            run_id,
            str(chatty),
            str(done),
            end,
        ],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")},
        stdout=subprocess.PIPE,  # not read until the worker is done: a stalled console
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not done.exists():
            assert agent.poll() is None, "the agent ended early"
            assert time.monotonic() < deadline, "the worker was stalled by the unread console"
            time.sleep(0.05)
        log = tmp_path / "runs" / run_id / "attempt_0" / "rank_0.log"
        deadline = time.monotonic() + 60
        while not (log.exists() and log.stat().st_size == len(expected())):
            assert time.monotonic() < deadline, "the log file never got all the worker wrote"
            time.sleep(0.05)
        out, err = agent.communicate(timeout=120)  # now the console is read
    finally:
        agent.kill()
        agent.communicate()
    assert log.read_bytes() == expected()
    assert agent.returncode == (0 if end == "exit" else 1), err.decode()
    text = out.decode()
    shown = sum(1 for line in text.splitlines() if re.match(r"\[[^\]]+:0\] line \d{8} x+$", line))
    notices = re.findall(
        r"\[rallypoint\] console fell behind: (\d+) lines from rank 0 not shown \(complete in (.+)\)", text
    )
    # drops are noticed on stdout once the console catches up; a console still stuck when the job
    # ends is given up after a moment (issue #35, item 4), and the agent's last words count them all
    assert {(tmp_path / where).resolve() for _, where in notices} <= {log.resolve()}  # relative to the agent's cwd
    counted = re.findall(r"console: (\d+) line\(s\) not shown", err.decode())
    assert counted, "the agent did not count the lines its console did not show"
    assert shown + int(counted[-1]) == LINES
    assert shown + sum(int(n) for n, _ in notices) <= LINES


@pytest.mark.parametrize(("tee", "shown"), [("7,", False), ("0,7", True), ("none", True)])
def test_a_tee_that_selects_no_rank_says_so(tmp_path: Path, tee: str, shown: bool) -> None:
    hello = tmp_path / "hello.py"
    hello.write_text('print("hello from the worker")\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    proc = subprocess.run(
        [*RALLYPOINT, "run", "--tee", tee, str(hello)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    notice = "selects no rank of this job (ranks 0..0): no worker output reaches the console"
    # a list of ranks that misses every worker is almost always a mistake (torchrun's --tee 3 read as
    # a rank, say); "none" is what the user asked for and needs no remark
    assert (notice in proc.stderr) is not shown
    assert ("hello from the worker" in proc.stdout) is (tee == "0,7")
    log = next((tmp_path / "runs").glob("*/attempt_0/rank_0.log")).read_text()
    assert "hello from the worker" in log
