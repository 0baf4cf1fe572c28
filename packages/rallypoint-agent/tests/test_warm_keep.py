"""Kept warm processes (``[agent] preload_keep``): reused by the next agent, never stale, never shared.

Each test has a runtime directory of its own (``XDG_RUNTIME_DIR``, short: a Unix socket's path
has at most 107 bytes) and preloads ``keepmod``, a module written here that records the pid of
every process that imports it, so that a test sees whether a warm process was reused.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.agent.warm import WarmLauncher, _server, keep
from rallypoint.agent.warm.cli import warm as warm_command

PY = sys.executable

KEEPMOD = """
import os
VALUE = 1
with open(os.path.join(os.path.dirname(__file__), "imports.log"), "a") as f:
    f.write(f"{os.getpid()}\\n")
"""

REPORT = """
import json, os, sys
import keepmod
out = {"pid": os.getpid(), "ppid": os.getppid(), "value": keepmod.VALUE, "seen": getattr(keepmod, "SEEN", None)}
keepmod.SEEN = sys.argv[1] if len(sys.argv) > 1 else "?"  # set by this job: the next job's worker must not see it
with open(os.environ["OUT"], "w") as f:
    json.dump(out, f)
if len(sys.argv) > 2:
    import time
    time.sleep(float(sys.argv[2]))
"""


def wait_until(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private ``XDG_RUNTIME_DIR``; every kept warm process left in it is killed at the end."""
    directory = Path(tempfile.mkdtemp(prefix="rpk"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(directory))
    yield directory
    for info in keep.kept_servers():
        os.kill(int(info["pid"]), signal.SIGKILL)


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "keepmod.py").write_text(textwrap.dedent(KEEPMOD))
    (lib / "report.py").write_text(textwrap.dedent(REPORT))
    return lib


def launcher(lib: Path, seconds: float = 60.0) -> WarmLauncher:
    return WarmLauncher(["keepmod"], env={**os.environ, "PYTHONPATH": str(lib)}, keep=seconds)


def run_job(warm: WarmLauncher, lib: Path, out: Path, *args: str) -> dict:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(lib), "OUT": str(out)}
    worker = warm.spawn([PY, "-u", str(lib / "report.py"), *args], env=env, cwd=lib)
    assert worker.wait(30) == 0
    return json.loads(out.read_text())


def imports(lib: Path) -> list[str]:
    return (lib / "imports.log").read_text().split()


def test_the_next_agent_forks_from_the_kept_warm_process_and_nothing_of_a_job_leaks(
    runtime: Path, lib: Path, tmp_path: Path
) -> None:
    first = launcher(lib)
    job1 = run_job(first, lib, tmp_path / "1.json", "job1")
    server = first.pid
    assert not first.attached
    first.close()
    assert server is not None
    assert alive(server)
    second = launcher(lib)
    job2 = run_job(second, lib, tmp_path / "2.json", "job2")
    assert second.attached
    assert second.pid == server == job2["ppid"] == job1["ppid"]
    assert job2["seen"] is None  # job 1's module global is not in job 2's fresh fork
    assert imports(lib) == [str(server)]  # imported once, by the warm process
    second.close()
    assert alive(server)


def test_a_changed_module_is_never_run_from_a_kept_process(runtime: Path, lib: Path, tmp_path: Path) -> None:
    first = launcher(lib)
    assert run_job(first, lib, tmp_path / "1.json")["value"] == 1
    old = first.pid
    first.close()
    source = lib / "keepmod.py"
    source.write_text(source.read_text().replace("VALUE = 1", "VALUE = 2"))
    console = io.StringIO()
    second = WarmLauncher(["keepmod"], env={**os.environ, "PYTHONPATH": str(lib)}, keep=60, console=console)
    job = run_job(second, lib, tmp_path / "2.json")
    assert job["value"] == 2  # the new code runs
    assert job["ppid"] != old
    assert not second.attached
    assert old is not None
    assert wait_until(lambda: not alive(old))
    # and a change under a running agent: its next fork comes from a new warm process
    source.write_text(source.read_text().replace("VALUE = 2", "VALUE = 3"))
    job = run_job(second, lib, tmp_path / "3.json")
    assert job["value"] == 3
    assert "keepmod.py changed since the warm process" in console.getvalue()
    second.close()


def test_a_kept_process_ends_after_keep_seconds_without_agents(runtime: Path, lib: Path, tmp_path: Path) -> None:
    warm = launcher(lib, seconds=2.0)
    run_job(warm, lib, tmp_path / "1.json")
    pid = warm.pid
    warm.close()
    assert pid is not None
    assert alive(pid)
    assert wait_until(lambda: not keep.kept_servers(), 10.0)  # asked about every 20 ms: that does not keep it
    assert wait_until(lambda: not alive(pid), 10.0)
    assert not list((runtime / "rallypoint").glob("*.sock"))  # it removed its socket


AGENT = """
import os, sys, time
from rallypoint.agent.warm import WarmLauncher
lib, out = sys.argv[1], sys.argv[2]
warm = WarmLauncher(["keepmod"], env={**os.environ, "PYTHONPATH": lib}, keep=60)
env = {"PATH": os.environ["PATH"], "PYTHONPATH": lib, "OUT": out}
w = warm.spawn([sys.executable, "-u", os.path.join(lib, "report.py"), "x", "600"], env=env)
print(w.pid, warm.pid, flush=True)
time.sleep(600)
"""


def test_an_agent_killed_with_sigkill_leaves_no_worker_behind(runtime: Path, lib: Path, tmp_path: Path) -> None:
    agent = subprocess.Popen([PY, "-c", AGENT, str(lib), str(tmp_path / "w.json")], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        worker, server = map(int, agent.stdout.readline().split())
        assert wait_until(lambda: (tmp_path / "w.json").exists())
        agent.kill()
        agent.wait()
        assert wait_until(lambda: not alive(worker), 10.0)  # killed by the warm process, its parent
        assert alive(server)  # which stays for the next agent
    finally:
        agent.kill()
        agent.wait()


def test_concurrent_agents_share_one_kept_process(runtime: Path, lib: Path, tmp_path: Path) -> None:
    launchers = [launcher(lib) for _ in range(3)]
    jobs: dict[int, dict] = {}

    def one(i: int) -> None:
        jobs[i] = run_job(launchers[i], lib, tmp_path / f"{i}.json", str(i), "0.5")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(jobs) == [0, 1, 2]
    assert len({job["ppid"] for job in jobs.values()}) == 1  # all forked by the same warm process
    assert len(imports(lib)) == 1
    assert sum(w.attached for w in launchers) == 2
    for w in launchers:
        w.close()


def test_another_user_is_turned_away(runtime: Path, lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server checks its peer's uid (SO_PEERCRED); here the check is made to see another uid."""
    listener_path = Path(tempfile.mkdtemp(prefix="rpp")) / "s.sock"
    ours, theirs = socket.socketpair()
    server = _server.Server(theirs, keep=60.0)
    server.listen(str(listener_path))
    assert oct(listener_path.stat().st_mode & 0o777) == "0o600"
    monkeypatch.setattr(_server, "peer_uid", lambda sock: os.getuid() + 1)
    client = socket.socket(socket.AF_UNIX)
    client.connect(str(listener_path))
    server.accept()
    assert len(server.conns) == 1  # only the first agent's: the stranger's connection was closed
    client.settimeout(5)
    assert client.recv(1) == b""
    monkeypatch.undo()
    friend = socket.socket(socket.AF_UNIX)
    friend.connect(str(listener_path))
    server.accept()
    assert len(server.conns) == 2
    for sock in (client, friend, ours, *server.conns):
        sock.close()
    server.retire()
    server.selector.close()
    assert not listener_path.exists()


def test_the_runtime_directory_must_be_private(runtime: Path, lib: Path, tmp_path: Path) -> None:
    directory = keep.secure_runtime_dir()
    assert directory == runtime / "rallypoint"
    assert directory.stat().st_mode & 0o777 == 0o700
    directory.chmod(0o755)
    with pytest.raises(keep.KeepDirectoryError, match="not a directory of this user's alone"):
        keep.secure_runtime_dir()
    # an agent then runs with a warm process of its own, which ends with it
    warm = launcher(lib)
    job = run_job(warm, lib, tmp_path / "1.json")
    warm.close()
    assert wait_until(lambda: not alive(job["ppid"]), 10.0)
    assert not list(directory.glob("*.sock"))
    directory.chmod(0o700)


def test_the_reuse_key_covers_what_a_worker_inherits() -> None:
    env = {"PATH": "/bin", "PYTHONPATH": "/a"}
    key = keep.reuse_key(PY, ["torch"], env)
    assert keep.reuse_key(PY, ["torch"], {**env, "PWD": "/elsewhere", "OLDPWD": "/x"}) == key
    assert keep.reuse_key(PY, ["torch"], {**env, "PYTHONPATH": "/b"}) != key
    assert keep.reuse_key(PY, ["torch", "numpy"], env) != key
    assert keep.reuse_key(os.path.realpath(PY), ["torch"], env) == key  # the interpreter's real path


def test_warm_list_and_stop(runtime: Path, lib: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    warm = launcher(lib)
    run_job(warm, lib, tmp_path / "1.json")
    pid = warm.pid
    warm.close()
    runner = CliRunner()
    listed = runner.invoke(warm_command, ["list", "--json"])
    assert listed.exit_code == 0, listed.output
    (info,) = [json.loads(line) for line in listed.output.splitlines()]
    assert info["pid"] == pid
    assert info["modules"] == ["keepmod"]
    assert info["agents"] == 0  # the query is not an agent
    # a job still running keeps its warm process until it ends; no new job is taken
    busy = launcher(lib)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(lib), "OUT": str(tmp_path / "2.json")}
    worker = busy.spawn([PY, "-u", str(lib / "report.py"), "x", "1"], env=env)
    stopped = runner.invoke(warm_command, ["stop", str(pid)])
    assert stopped.exit_code == 0, stopped.output
    assert f"stopping warm process {pid} (keepmod): exits after its 1 running job(s)" in stopped.output
    assert runner.invoke(warm_command, ["list"]).output.startswith("no kept warm process")
    assert worker.wait(30) == 0
    busy.close()
    assert pid is not None
    assert wait_until(lambda: not alive(pid), 10.0)
    assert runner.invoke(warm_command, ["stop", "1"]).exit_code == 1
