"""Warm workers (rallypoint.agent.warm): forked workers behave as fresh interpreters would.

Every test uses one warm process per module (``launcher`` fixture) that preloads a small module
written here (``warmmod``), which records the pid of the process that imported it: a worker that
sees another pid than its own got the module from the warm process, without importing it again.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.agent.logs import WorkerLogs
from rallypoint.agent.warm import WarmLauncher, WarmRefusedError, preload_problem, warm_environment
from rallypoint.agent.workers import WorkerGroup, WorkerSpec, WorkerStartError

PY = sys.executable

WARMMOD = """
import os
IMPORTED_BY = os.getpid()
with open(os.path.join(os.path.dirname(__file__), "imports.log"), "a") as f:
    f.write(f"{IMPORTED_BY}\\n")
"""

REPORT = """
import ctypes, json, os, stat, sys
import warmmod
libc = ctypes.CDLL(None)
sig = ctypes.c_int(0)
libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
print("to stdout")
print("to stderr", file=sys.stderr)
out = {
    "argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "name": __name__,
    "path0": sys.path[0], "pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
    "ppid": os.getppid(), "pdeathsig": sig.value, "imported_by": warmmod.IMPORTED_BY,
    "stdin": stat.S_ISCHR(os.fstat(0).st_mode) and os.path.realpath("/proc/self/fd/0"),
}
with open(os.environ["OUT"], "w") as f:
    json.dump(out, f)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def wait_until(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lib = tmp_path_factory.mktemp("warmlib")
    (lib / "warmmod.py").write_text(textwrap.dedent(WARMMOD))
    (lib / "report.py").write_text(textwrap.dedent(REPORT))
    return lib


@pytest.fixture(scope="module")
def launcher(libdir: Path) -> Iterator[WarmLauncher]:
    env = {**os.environ, "PYTHONPATH": str(libdir), "ONLY_IN_WARM": "1"}
    warm = WarmLauncher(["warmmod"], env=env)
    warm.start()
    yield warm
    warm.close()


def worker_env(libdir: Path, out: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(libdir), "OUT": str(out), **extra}


def test_a_forked_worker_has_the_environment_cwd_argv_and_stdio_of_a_fresh_one(
    launcher: WarmLauncher, libdir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    read_out, write_out = os.pipe()
    read_err, write_err = os.pipe()
    handle = launcher.spawn(
        [PY, "-u", str(libdir / "report.py"), "7", "--flag"],
        env=worker_env(libdir, out, RANK="3"),
        cwd=tmp_path,
        stdout=write_out,
        stderr=write_err,
    )
    os.close(write_out)
    os.close(write_err)
    assert handle.wait(30) == 7
    with open(read_out, "rb") as o, open(read_err, "rb") as e:
        assert o.read() == b"to stdout\n"
        assert e.read() == b"to stderr\n"
    seen = json.loads(out.read_text())
    assert seen["argv"] == [str(libdir / "report.py"), "7", "--flag"]
    assert seen["cwd"] == str(tmp_path)
    assert seen["env"] == worker_env(libdir, out, RANK="3")  # replaced exactly: ONLY_IN_WARM is gone
    assert seen["name"] == "__main__"
    assert seen["path0"] == str(libdir)  # the script's directory, as python script.py sets it
    assert seen["sid"] == seen["pgid"] == seen["pid"] == handle.pid  # a session of its own
    assert seen["ppid"] == launcher.pid
    assert seen["pdeathsig"] == signal.SIGKILL
    assert seen["stdin"] == "/dev/null"
    assert seen["imported_by"] == launcher.pid  # the module came from the warm process


def test_restarts_fork_new_workers_without_importing_again(
    launcher: WarmLauncher, libdir: Path, tmp_path: Path
) -> None:
    pids = []
    for attempt in range(3):
        out = tmp_path / f"out{attempt}.json"
        handle = launcher.spawn([PY, "-u", str(libdir / "report.py")], env=worker_env(libdir, out))
        assert handle.wait(30) == 0
        seen = json.loads(out.read_text())
        assert seen["imported_by"] == launcher.pid != seen["pid"]
        pids.append(seen["pid"])
    assert len(set(pids)) == 3  # a fresh fork each time: no state shared between attempts
    assert (libdir / "imports.log").read_text().split() == [str(launcher.pid)]


def test_module_mode_runs_the_module_as_main(launcher: WarmLauncher, libdir: Path, tmp_path: Path) -> None:
    pkg = tmp_path / "wpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("import sys\nif __name__ == '__main__':\n    sys.exit(len(sys.argv[1:]) + 40)\n")
    handle = launcher.spawn([PY, "-u", "-m", "wpkg.job", "a", "b"], env=worker_env(libdir, tmp_path), cwd=tmp_path)
    assert handle.wait(30) == 42


@pytest.mark.parametrize(
    ("body", "returncode", "stderr"),
    [
        ("import sys\nsys.exit('bye')\n", 1, "bye\n"),
        ("import sys\nsys.exit(None)\n", 0, ""),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", -signal.SIGKILL, ""),
        ("raise KeyboardInterrupt\n", -signal.SIGINT, "KeyboardInterrupt"),
        ("def f():\n    raise ValueError('boom')\nf()\n", 1, "ValueError: boom"),
    ],
)
def test_exit_codes_signals_and_tracebacks_are_those_of_a_fresh_interpreter(
    launcher: WarmLauncher, libdir: Path, tmp_path: Path, body: str, returncode: int, stderr: str
) -> None:
    (tmp_path / "s.py").write_text(body)
    read_err, write_err = os.pipe()
    handle = launcher.spawn([PY, "-u", str(tmp_path / "s.py")], env=worker_env(libdir, tmp_path), stderr=write_err)
    os.close(write_err)
    assert handle.wait(30) == returncode
    with open(read_err, "rb") as e:
        text = e.read().decode()
    assert stderr in text
    assert "_server.py" not in text  # the traceback shows the script only
    assert "runpy" not in text
    if "boom" in stderr:
        assert text.startswith("Traceback (most recent call last):\n  File ")
        assert str(tmp_path / "s.py") in text.splitlines()[1]


def test_an_exited_worker_stays_a_zombie_until_reaped(launcher: WarmLauncher, libdir: Path, tmp_path: Path) -> None:
    handle = launcher.spawn([PY, "-u", str(libdir / "report.py"), "5"], env=worker_env(libdir, tmp_path / "o"))
    assert handle.wait_no_reap(30) == 5
    assert handle.returncode is None
    assert state(handle.pid) == "Z"  # its pid (and process group) cannot be reused yet
    assert handle.poll() == 5
    assert wait_until(lambda: state(handle.pid) is None)


def test_a_missing_working_directory_fails_the_start(launcher: WarmLauncher, libdir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        launcher.spawn([PY, "-u", str(libdir / "report.py")], env={}, cwd=tmp_path / "missing")


def test_a_missing_script_exits_2_like_python(launcher: WarmLauncher, libdir: Path, tmp_path: Path) -> None:
    read_err, write_err = os.pipe()
    handle = launcher.spawn([PY, "-u", str(tmp_path / "nope.py")], env={}, stderr=write_err)
    os.close(write_err)
    assert handle.wait(30) == 2
    with open(read_err, "rb") as e:
        assert b"can't open file" in e.read()


def test_worker_group_logs_signals_and_stop_work_with_warm_workers(
    launcher: WarmLauncher, libdir: Path, tmp_path: Path
) -> None:
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('term', os.environ['RANK'], flush=True), sys.exit(9)))\n"
        "print('up', os.environ['RANK'], flush=True)\n"
        "time.sleep(60)\n"
    )
    logs = WorkerLogs(tmp_path / "runs", 0, host="h", tee="none")
    group = WorkerGroup(logs=logs, warm=launcher)
    specs = [
        WorkerSpec(rank=r, argv=[PY, "-u", str(sleeper)], env=worker_env(libdir, tmp_path, RANK=str(r)))
        for r in range(2)
    ]
    group.start(specs)
    log = [tmp_path / "runs" / "attempt_0" / f"rank_{r}.log" for r in range(2)]
    assert wait_until(lambda: all(p.exists() and "up" in p.read_text() for p in log))
    exits = group.stop(grace=30)
    logs.close()
    assert {r: e.returncode for r, e in exits.items()} == {0: 9, 1: 9}
    assert [p.read_text().split() for p in log] == [["up", "0", "term", "0"], ["up", "1", "term", "1"]]
    assert wait_until(lambda: all(state(e.pid) is None for e in exits.values()))  # reaped by the warm process


def test_a_start_failure_in_a_group_names_the_rank(launcher: WarmLauncher, libdir: Path, tmp_path: Path) -> None:
    group = WorkerGroup(warm=launcher)
    with pytest.raises(WorkerStartError, match="rank 4"):
        group.start([WorkerSpec(rank=4, argv=[PY, "-u", str(libdir / "report.py")], cwd=tmp_path / "gone")])


def test_a_dead_warm_process_is_replaced_and_its_workers_report_sigkill(libdir: Path, tmp_path: Path) -> None:
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    console = io.StringIO()
    warm = WarmLauncher(["warmmod"], env={**os.environ, "PYTHONPATH": str(libdir)}, console=console)
    try:
        worker = warm.spawn([PY, "-u", str(sleeper)], env={})
        first = warm.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert worker.wait(30) == -signal.SIGKILL  # its parent-death signal
        assert wait_until(lambda: state(worker.pid) is None)
        out = tmp_path / "out.json"
        again = warm.spawn([PY, "-u", str(libdir / "report.py")], env=worker_env(libdir, out))
        assert again.wait(30) == 0
        assert warm.starts == 2
        assert json.loads(out.read_text())["imported_by"] == warm.pid != first
        assert f"the warm process (pid {first}) ended (signal SIGKILL); starting a new one" in console.getvalue()
    finally:
        warm.close()


def test_a_spawn_right_after_the_warm_process_was_killed_gets_a_new_one(libdir: Path, tmp_path: Path) -> None:
    warm = WarmLauncher(["warmmod"], env={**os.environ, "PYTHONPATH": str(libdir)}, console=io.StringIO())
    try:
        warm.start()
        first = warm.pid
        assert first is not None
        assert warm.spawn([PY, "-u", str(libdir / "report.py")], env=worker_env(libdir, tmp_path / "a")).wait(30) == 0
        os.kill(first, signal.SIGKILL)  # no waiting: the launcher may not have noticed yet
        out = tmp_path / "b.json"
        assert warm.spawn([PY, "-u", str(libdir / "report.py")], env=worker_env(libdir, out)).wait(30) == 0
        assert json.loads(out.read_text())["imported_by"] == warm.pid != first
    finally:
        warm.close()


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("threadmod", "started 1 thread(s) (busy)"),
        ("sockmod", "opened socket(s)"),
        ("brokenmod", "cannot preload 'brokenmod': ZeroDivisionError"),
        ("torch", "initialised CUDA"),
    ],
)
def test_modules_that_make_forking_unsafe_are_refused(tmp_path: Path, module: str, message: str) -> None:
    (tmp_path / "threadmod.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), name='busy', daemon=True).start()\n"
    )
    (tmp_path / "sockmod.py").write_text("import socket\nS = socket.socket()\n")
    (tmp_path / "brokenmod.py").write_text("1 / 0\n")
    fake_torch = tmp_path / "torch"  # stands in for a torch that initialised CUDA at import
    fake_torch.mkdir()
    (fake_torch / "__init__.py").write_text(
        "class cuda:\n    @staticmethod\n    def is_initialized():\n        return True\n"
    )
    warm = WarmLauncher([module], env={**os.environ, "PYTHONPATH": str(tmp_path)})
    try:
        with pytest.raises(WarmRefusedError, match=r"agent\.preload") as info:
            warm.spawn([PY, "-u", str(tmp_path / "x.py")], env={})
        assert message in str(info.value)
        assert info.value.exit_code == 2
        with pytest.raises(WarmRefusedError):  # refused for good, not restarted
            warm.spawn([PY, "-u", str(tmp_path / "x.py")], env={})
        assert warm.starts == 1
    finally:
        warm.close()


def test_only_python_scripts_and_modules_can_be_preloaded() -> None:
    assert preload_problem([PY, "-u", "train.py", "--x"]) is None
    assert preload_problem([PY, "-u", "-m", "pkg.train"]) is None
    problem = preload_problem(["./train.sh", "--x"])
    assert problem is not None
    assert "'./train.sh' as a program" in problem


def test_the_warm_environment_holds_what_every_worker_shares() -> None:
    env = warm_environment({"PATH": "/bin"}, {"NCCL_DEBUG": "INFO"}, local_world_size=2)
    assert env == {
        "PATH": "/bin",
        "NCCL_DEBUG": "INFO",
        "OMP_NUM_THREADS": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "PYTHONUNBUFFERED": "1",
    }
    assert "OMP_NUM_THREADS" not in warm_environment({}, {}, local_world_size=1)
    assert warm_environment({"OMP_NUM_THREADS": "4"}, {}, local_world_size=8)["OMP_NUM_THREADS"] == "4"


def test_the_control_socket_is_not_inherited_by_workers(launcher: WarmLauncher, libdir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fds.json"
    body = (
        "import json, os, sys\n"
        "links = {}\n"
        "for fd in os.listdir('/proc/self/fd'):\n"
        "    try:\n"
        "        links[fd] = os.readlink('/proc/self/fd/' + fd)\n"
        "    except OSError:\n"
        "        pass\n"
        "json.dump(links, open(sys.argv[1], 'w'))\n"
    )
    (tmp_path / "fds.py").write_text(body)
    handle = launcher.spawn([PY, "-u", str(tmp_path / "fds.py"), str(out)], env={})
    assert handle.wait(30) == 0
    links = json.loads(out.read_text())
    assert [fd for fd, target in links.items() if target.startswith("socket:")] == []


def test_closing_a_launcher_still_importing_does_not_wait_for_the_import(tmp_path: Path) -> None:
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(60)\n")
    warm = WarmLauncher(["slowmod"], env={**os.environ, "PYTHONPATH": str(tmp_path)})
    warm.start()
    pid = warm.pid
    assert pid is not None
    started = time.monotonic()
    warm.close()
    assert time.monotonic() - started < 5.0  # not the 60 s import, nor the 5 s grace
    assert wait_until(lambda: state(pid) is None)


def test_workers_draw_their_own_random_numbers(tmp_path: Path) -> None:
    """``random`` and NumPy's global generator, seeded in the warm process, are reseeded in each worker."""
    body = (
        "import json, random, sys\nimport numpy\n"
        "json.dump([random.random(), numpy.random.random()], open(sys.argv[1], 'w'))\n"
    )
    (tmp_path / "draw.py").write_text(body)
    warm = WarmLauncher(["numpy.random", "random"])
    try:
        for name in ("a", "b"):
            assert warm.spawn([PY, "-u", str(tmp_path / "draw.py"), str(tmp_path / name)], env={}).wait(60) == 0
    finally:
        warm.close()
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a", "b"))
    assert a[0] != b[0]
    assert a[1] != b[1]
