"""Nothing a worker started outlives its job: SIGKILL of the agent, a restart, SIGTERM (issue #11, item 7).

Each worker starts two grandchildren: one in the worker's process group, one in a process group
of its own (as a shell with job control does). They write their pids to files; the tests then
end the agent or the attempt and poll, with a deadline, until every one of them is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

#: argv: <output dir> <mode>; mode "fail" makes rank 1 of attempt 0 exit 1 once both trees exist.
TREE = """
import json, os, subprocess, sys, time
out, mode = sys.argv[1], sys.argv[2]
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]

def alive(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")

if attempt == "1":  # after the restart: is anything of attempt 0 still there?
    left = [p for r in (0, 1) for p in json.load(open(os.path.join(out, f"tree0_{r}")))]
    with open(os.path.join(out, f"seen{rank}"), "w") as f:
        json.dump([p for p in left if alive(p)], f)
    sys.exit(0)
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
pids = [subprocess.Popen(sleep).pid, subprocess.Popen(sleep, process_group=0).pid]
path = os.path.join(out, f"tree{attempt}_{rank}")
with open(path + ".tmp", "w") as f:
    json.dump(pids, f)
os.replace(path + ".tmp", path)
if mode == "fail" and rank == "1":
    while not os.path.exists(os.path.join(out, "tree0_0")):
        time.sleep(0.01)
    sys.exit(1)
time.sleep(120)
"""


def agent_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def poll(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def tree_pids(out: Path, attempt: int = 0) -> list[int]:
    files = [out / f"tree{attempt}_{rank}" for rank in range(2)]
    assert poll(lambda: all(f.exists() for f in files), 60), "the workers did not start their grandchildren"
    pids = [int(p) for f in files for p in f.read_text().strip("[]").split(",")]
    assert len(pids) == 4
    return pids


def start_agent(tmp_path: Path, run_id: str, mode: str, *flags: str) -> subprocess.Popen[str]:
    tree = tmp_path / "tree.py"
    tree.write_text(textwrap.dedent(TREE))
    return subprocess.Popen(
        [*RALLYPOINT, "run", "--nproc-per-node", "2", "--run-id", run_id, *flags, str(tree), str(tmp_path), mode],
        cwd=tmp_path,
        env=agent_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_an_agent_killed_with_sigkill_leaves_no_grandchild(tmp_path: Path) -> None:
    agent = start_agent(tmp_path, "tree-kill", "sleep")
    pids: list[int] = []
    try:
        pids = tree_pids(tmp_path)
        assert all(alive(p) for p in pids)
        agent.kill()
        agent.wait(timeout=30)
        assert poll(lambda: not any(alive(p) for p in pids), 10), (
            f"still alive after the agent's SIGKILL: {[p for p in pids if alive(p)]}"
        )
    finally:
        agent.kill()
        agent.communicate(timeout=30)
        kill_all(pids)


def test_sigterm_to_the_agent_leaves_no_grandchild(tmp_path: Path) -> None:
    agent = start_agent(tmp_path, "tree-term", "sleep")
    pids: list[int] = []
    try:
        pids = tree_pids(tmp_path)
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
        assert agent.returncode == 128 + signal.SIGTERM, err
        # the agent stopped the workers before exiting: nothing may be left by now, but give the
        # kernel a moment to finish processes it is still tearing down
        assert poll(lambda: not any(alive(p) for p in pids), 10), (
            f"still alive after the agent's SIGTERM: {[p for p in pids if alive(p)]}"
        )
    finally:
        agent.kill()
        agent.communicate(timeout=30)
        kill_all(pids)


def test_a_restart_leaves_no_grandchild_of_the_previous_attempt(tmp_path: Path) -> None:
    agent = start_agent(tmp_path, "tree-restart", "fail", "--max-restarts", "1")
    pids: list[int] = []
    try:
        pids = tree_pids(tmp_path)
        _, err = agent.communicate(timeout=120)
        assert agent.returncode == 0, err
        # what the workers of attempt 1 saw when they started: the restart had ended attempt 0's tree
        for rank in range(2):
            assert (tmp_path / f"seen{rank}").read_text() == "[]", f"rank {rank} saw attempt 0's grandchildren"
    finally:
        agent.kill()
        agent.communicate(timeout=30)
        kill_all(pids)
