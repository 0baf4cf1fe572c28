"""Logs cannot be redirected through planted links, read by others, or overwritten by a later run (#35, item 6).

The tests run as root (as CI does) with a real second user, uid 65534 (``nobody``): what that user
plants, it plants itself (``setpriv``), in a directory under ``/tmp`` that every user may reach.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]
NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
SECRET = b"root only: never to be overwritten\n"

#: argv: <marker> <tag>: creates the marker (a worker ran) and prints its tag.
WORKER = "import sys; open(sys.argv[1], 'a').close(); print('output of', sys.argv[2], flush=True)\n"


@pytest.fixture
def area() -> Iterator[Path]:
    """A root-owned directory under /tmp that every user may enter (mode 0755)."""
    path = Path(tempfile.mkdtemp(prefix="rallypoint-logs-", dir="/tmp"))
    path.chmod(0o755)
    (path / "worker.py").write_text(WORKER)
    secret = path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    (path / "rootdir").mkdir(mode=0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def as_nobody(script: str, cwd: Path) -> None:
    subprocess.run([*AS_NOBODY, "sh", "-euc", script], cwd=cwd, check=True)


def rallypoint(area: Path, *flags: str, tag: str = "run") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    return subprocess.run(
        [*RALLYPOINT, "run", *flags, str(area / "worker.py"), str(area / "ran"), tag],
        cwd=area,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_refused(done: subprocess.CompletedProcess[str], area: Path, *names: str) -> str:
    """Exit 2 before any worker started, with one line that names the path and what to do."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert not (area / "ran").exists(), "a worker started"
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    for name in names:
        assert name in line, line
    assert "--log-dir" in line, line  # says what to do
    return line


def assert_untouched(area: Path) -> None:
    assert (area / "secret").read_bytes() == SECRET
    assert stat.S_IMODE((area / "secret").stat().st_mode) == 0o600
    assert os.listdir(area / "rootdir") == []


@pytest.mark.parametrize("theirs", [True, False], ids=["their-directory", "our-directory"])
def test_a_link_planted_at_a_rank_log_is_refused(area: Path, theirs: bool) -> None:
    if theirs:  # a shared scratch directory where the other user got there first
        (area / "runs").mkdir(mode=0o1777)
        (area / "runs").chmod(0o1777)
        plant = "mkdir -p runs/job/attempt_0 && chmod -R 777 runs/job"
        as_nobody(f"{plant} && ln -s ../../../secret runs/job/attempt_0/rank_0.log", area)
    else:  # the link alone is foreign (how it got there does not matter)
        (area / "runs" / "job" / "attempt_0").mkdir(mode=0o700, parents=True)
        link = area / "runs" / "job" / "attempt_0" / "rank_0.log"
        link.symlink_to(area / "secret")
        os.lchown(link, NOBODY, NOBODY)
    done = rallypoint(area, "--run-id", "job")
    line = assert_refused(done, area, str(area / "runs" / "job"))
    assert "owned by uid 65534 (nobody)" in line
    assert_untouched(area)


@pytest.mark.parametrize("theirs", [True, False], ids=["their-directory", "our-directory"])
def test_a_link_planted_at_an_attempt_directory_is_refused(area: Path, theirs: bool) -> None:
    if theirs:
        (area / "runs").mkdir(mode=0o1777)
        (area / "runs").chmod(0o1777)
        as_nobody("mkdir -p runs/job && chmod 777 runs/job && ln -s ../../rootdir runs/job/attempt_0", area)
    else:
        (area / "runs" / "job").mkdir(mode=0o700, parents=True)
        link = area / "runs" / "job" / "attempt_0"
        link.symlink_to(area / "rootdir")
        os.lchown(link, NOBODY, NOBODY)
    done = rallypoint(area, "--nproc-per-node", "2", "--run-id", "job")
    assert_refused(done, area, str(area / "runs" / "job"))
    assert_untouched(area)


def _loose(area: Path) -> None:
    (area / "runs" / "job").mkdir(parents=True)
    (area / "runs" / "job").chmod(0o777)


def _group(area: Path) -> None:
    (area / "runs" / "job").mkdir(parents=True)
    os.chown(area / "runs" / "job", -1, NOBODY)
    (area / "runs" / "job").chmod(0o770)


def _foreign(area: Path) -> None:
    (area / "runs").mkdir(mode=0o1777)
    (area / "runs").chmod(0o1777)
    as_nobody("mkdir runs/job", area)


def _open_parent(area: Path) -> None:
    (area / "runs").mkdir()
    (area / "runs").chmod(0o777)  # every user may write it, no sticky bit: runs/job can be swapped


def _foreign_parent_in_tmp(area: Path) -> None:
    (area / "runs").mkdir(mode=0o1777)
    (area / "runs").chmod(0o1777)
    as_nobody("mkdir -m 755 runs/shared", area)  # theirs: they can rename what we create in it


@pytest.mark.parametrize(
    ("setup", "log_dir", "named", "why"),
    [
        (_loose, "runs/job", "runs/job", "writable by every user"),
        (_group, "runs/job", "runs/job", "writable by group gid 65534"),
        (_foreign, "runs/job", "runs/job", "owned by uid 65534 (nobody)"),
        (_open_parent, "runs/job", "runs", "is writable by every user (mode 0777) and has no sticky bit"),
        (_foreign_parent_in_tmp, "runs/shared/job", "runs/shared", "owned by uid 65534 (nobody)"),
    ],
    ids=["every-user", "another-group", "another-owner", "parent-every-user", "parent-of-another-user"],
)
def test_a_log_directory_another_user_could_write_is_refused(
    area: Path, setup: object, log_dir: str, named: str, why: str
) -> None:
    setup(area)  # type: ignore[operator]
    done = rallypoint(area, "--log-dir", log_dir)
    line = assert_refused(done, area, str(area / named))
    assert why in line


def test_reusing_a_log_directory_keeps_the_earlier_logs(area: Path) -> None:
    first = rallypoint(area, "--log-dir", "logs", tag="the first run")
    assert first.returncode == 0, first.stderr
    earlier = {p: p.read_bytes() for p in (area / "logs").rglob("*") if p.is_file()}
    assert (area / "logs" / "attempt_0" / "rank_0.log").read_text() == "output of the first run\n"
    second = rallypoint(area, "--log-dir", "logs", tag="the second run")
    assert second.returncode == 0, second.stderr
    assert {p: p.read_bytes() for p in (area / "logs").rglob("*") if p.is_file()} == earlier
    assert (area / "logs.1" / "attempt_0" / "rank_0.log").read_text() == "output of the second run\n"
    assert "logs holds the logs of an earlier run; this run's logs go to logs.1" in second.stderr


def test_rerunning_a_run_id_keeps_the_earlier_logs(area: Path) -> None:
    for tag in ("first", "second"):
        done = rallypoint(area, "--run-id", "same", tag=tag)
        assert done.returncode == 0, done.stderr
    assert (area / "runs" / "same" / "attempt_0" / "rank_0.log").read_text() == "output of first\n"
    assert (area / "runs" / "same.1" / "attempt_0" / "rank_0.log").read_text() == "output of second\n"


def test_the_logs_are_private_whatever_the_umask(area: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    done = subprocess.run(
        ["sh", "-c", 'umask 000 && exec "$@"', "sh", *RALLYPOINT, "run", "--run-id", "open", "--max-restarts", "0",
         "-m", "this_module_does_not_exist"],
        cwd=area, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # the job fails: failure.json is written too
    root = area / "runs" / "open"
    made = [root, *root.rglob("*")]
    assert root / "failure.json" in made
    assert root / "attempt_0" / "rank_0.log" in made
    for path in made:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode & 0o077 == 0, f"{path}: mode {mode:04o}"
    assert stat.S_IMODE((area / "runs").stat().st_mode) & 0o077 == 0


def test_the_nodes_of_one_job_share_its_log_directory(area: Path) -> None:
    """Two agents of one job (a shared file system: one directory) write into the same log directory."""
    rdzv = area / "rdzv"
    flags = ["--nnodes", "2", "--rdzv-backend", "file", "--rdzv-endpoint", str(rdzv), "--run-id", "pair"]
    flags += ["--log-dir", "shared", str(area / "worker.py"), str(area / "ran"), "pair"]  # one job: one command line
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    agents = [
        subprocess.Popen(
            [*RALLYPOINT, "run", "--node-id", f"n{i}", *flags],
            cwd=area,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    results = [agent.communicate(timeout=120) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], results
    attempt = area / "shared" / "attempt_0"
    # each node's worker logs, and beside them the debug files (stacks, flight record) of both
    assert sorted(p.name for p in attempt.iterdir()) == ["debug", "rank_0.log", "rank_1.log"]
    debug = sorted(p.name for p in (attempt / "debug").iterdir())
    assert debug == ["rank_0.flight", "rank_0.stacks", "rank_1.flight", "rank_1.stacks"]
    assert not (area / "shared.1").exists()


def test_a_rerun_the_rendezvous_refuses_leaves_no_log_directory_behind(area: Path) -> None:
    flags = ["--rdzv-backend", "file", "--rdzv-endpoint", str(area / "rdzv"), "--run-id", "once"]
    assert rallypoint(area, *flags).returncode == 0
    again = rallypoint(area, *flags)
    assert again.returncode == 2, again.stderr
    assert "belongs to a job that already ended" in again.stderr
    assert sorted(p.name for p in (area / "runs").iterdir()) == ["once"]
