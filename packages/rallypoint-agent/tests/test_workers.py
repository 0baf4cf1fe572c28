"""Tests of rallypoint.agent.workers with real processes."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

from rallypoint.agent import console, death_signal
from rallypoint.agent import workers as workers_mod
from rallypoint.agent.logs import WorkerLogs
from rallypoint.agent.workers import (
    WorkerExit,
    WorkerGroup,
    WorkerSpec,
    WorkerStartError,
    signal_name,
)
from rallypoint.core.errors import RallypointError

PY = sys.executable


def py(code: str) -> list[str]:
    return [PY, "-u", "-c", textwrap.dedent(code)]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_until(predicate, timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_for_file(path: Path, timeout: float = 10.0) -> str:
    assert wait_until(path.exists, timeout), f"{path} never appeared"
    return path.read_text()


READY = """
import os, sys, time
def ready():
    tmp = sys.argv[1] + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, sys.argv[1])
"""


def test_exit_codes_and_signal_names():
    group = WorkerGroup()
    group.start(
        [
            WorkerSpec(0, py("pass")),
            WorkerSpec(1, py("raise SystemExit(3)")),
            WorkerSpec(2, py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")),
            WorkerSpec(3, py("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")),
        ]
    )
    exits = group.wait(timeout=20)
    assert exits is not None
    assert exits[0].ok
    assert exits[0].exit_code == 0
    assert exits[0].describe() == "exit code 0"
    assert exits[1].returncode == 3
    assert exits[1].signal_name is None
    assert exits[1].describe() == "exit code 3"
    assert exits[2].returncode == -9
    assert exits[2].signal_name == "SIGKILL"
    assert exits[2].exit_code is None
    assert exits[2].describe() == "signal SIGKILL"
    assert exits[3].signal_name == "SIGSEGV"
    for rank, e in exits.items():
        assert e.rank == rank
        assert e.pid == group.pids[rank]
        assert e.started_at <= e.exited_at <= time.time()
    assert group.running() == []
    assert group.stop(grace=1) == exits


def test_signal_name_helper():
    assert signal_name(0) is None
    assert signal_name(1) is None
    assert signal_name(-15) == "SIGTERM"
    assert signal_name(-200) == "SIG200"


def test_a_sigkilled_worker_is_noticed_as_it_dies_not_at_the_end_of_the_wait(tmp_path):
    seen: list[WorkerExit] = []
    group = WorkerGroup(on_exit=seen.append)
    sleeper = READY + "ready()\ntime.sleep(60)\n"
    group.start([WorkerSpec(r, [*py(sleeper), str(tmp_path / f"ready{r}")]) for r in (0, 1)])
    try:
        assert group.wait_any(timeout=0.2) is None  # nobody exited: the wait times out
        for r in (0, 1):
            wait_for_file(tmp_path / f"ready{r}")  # both are in their sleep
        killed_at = time.time()
        t0 = time.monotonic()
        os.kill(group.pids[1], signal.SIGKILL)
        event = group.wait_any(timeout=60)
        latency = time.monotonic() - t0
        assert event is not None
        assert event.rank == 1
        assert event.signal_name == "SIGKILL"
        # a watcher blocks on the process, so the wait returns at the death, far from its 60 s;
        # the bound leaves room for a loaded machine and still fails any polling with a long period
        assert latency < 5, f"death noticed after {latency:.3f} s"
        assert killed_at <= event.exited_at < killed_at + 5
        assert group.running() == [0]
        assert wait_until(lambda: len(seen) == 1, 10)
        assert seen[0] == event
    finally:
        exits = group.stop(grace=2)
    assert exits[0].signal_name == "SIGTERM"
    assert group.wait_any(timeout=0) is not None  # rank 0's exit, not returned before
    assert group.wait_any(timeout=30) is None  # all exits returned: no waiting (returns at once)


def test_stop_escalates_to_sigkill_for_a_worker_that_ignores_sigterm(tmp_path):
    stubborn = tmp_path / "stubborn"
    polite = tmp_path / "polite"
    code = READY + "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nready()\ntime.sleep(60)\n"
    group = WorkerGroup()
    group.start(
        [
            WorkerSpec(0, [*py(code), str(stubborn)]),
            WorkerSpec(1, [*py(READY + "ready()\ntime.sleep(60)\n"), str(polite)]),
        ]
    )
    wait_for_file(stubborn)
    wait_for_file(polite)
    t0 = time.monotonic()
    exits = group.stop(grace=0.6)
    elapsed = time.monotonic() - t0
    assert exits[0].signal_name == "SIGKILL"
    assert exits[1].signal_name == "SIGTERM"
    # the stubborn worker got its grace period before the SIGKILL (no upper bound: a loaded
    # machine may take its time to reap, and what matters is that stop() did not give up early)
    assert elapsed >= 0.5, f"SIGKILL came {elapsed:.3f} s after SIGTERM, before the grace period ended"
    assert not alive(exits[0].pid)
    assert not alive(exits[1].pid)
    assert group.stop(grace=1) == exits  # idempotent


def test_stop_without_grace_kills_at_once(tmp_path):
    ready = tmp_path / "ready"
    code = READY + "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nready()\ntime.sleep(60)\n"
    group = WorkerGroup()
    group.start([WorkerSpec(0, [*py(code), str(ready)])])
    wait_for_file(ready)
    exits = group.stop(grace=0)
    # SIGKILL straight away: no SIGTERM first (this worker ignores it, so a SIGTERM-and-wait
    # would have hung for the 30 s default grace)
    assert exits[0].signal_name == "SIGKILL"


def test_forward_signal_reaches_the_worker(tmp_path):
    ready = tmp_path / "ready"
    code = READY + ("import signal\nsignal.signal(signal.SIGUSR1, lambda *a: os._exit(7))\nready()\ntime.sleep(60)\n")
    with WorkerGroup() as group:
        group.start([WorkerSpec(0, [*py(code), str(ready)])])
        wait_for_file(ready)
        group.forward_signal(signal.SIGUSR1)
        event = group.wait_any(timeout=30)
        assert event is not None
        assert event.returncode == 7
        group.forward_signal(signal.SIGUSR1)  # nobody left: no error


def test_env_and_cwd(tmp_path):
    out = tmp_path / "out.txt"
    code = f"import os; open({str(out)!r}, 'w').write(os.environ['RP_TEST'] + '|' + os.getcwd())"
    group = WorkerGroup()
    group.start([WorkerSpec(0, py(code), env={**os.environ, "RP_TEST": "hello"}, cwd=tmp_path)])
    exits = group.wait(timeout=10)
    assert exits is not None
    assert exits[0].ok
    assert out.read_text() == f"hello|{os.path.realpath(tmp_path)}"


def test_workers_lead_their_own_process_group():
    group = WorkerGroup()
    group.start([WorkerSpec(0, py("import time; time.sleep(60)"))])
    try:
        pid = group.pids[0]
        assert os.getpgid(pid) == pid
        assert os.getsid(pid) == pid
        assert os.getpgid(pid) != os.getpgid(0)
    finally:
        group.stop(grace=0)


def test_stop_also_kills_what_a_finished_worker_left_behind(tmp_path):
    child_pid_file = tmp_path / "grandchild"
    code = f"""
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(child_pid_file)!r}, "w").write(str(p.pid))
    """
    group = WorkerGroup()
    group.start([WorkerSpec(0, py(code))])
    event = group.wait_any(timeout=10)
    assert event is not None
    assert event.ok
    grandchild = int(child_pid_file.read_text())
    assert alive(grandchild)
    group.stop(grace=0.2)
    assert wait_until(lambda: not alive(grandchild), 10)


def test_a_command_line_too_large_for_the_system_says_so_not_to_check_the_path():
    # 40 arguments of 100 KB: each fits, together they pass ARG_MAX, and execve fails with E2BIG
    group = WorkerGroup()
    with pytest.raises(WorkerStartError) as info:
        group.start([WorkerSpec(0, [*py("pass"), *["x" * 100_000] * 40])])
    message = str(info.value)
    assert "Argument list too long" in message
    assert "Its arguments hold 40" in message
    assert "(the longest 100000)" in message
    assert "write large data to a file and pass its path" in message
    assert "Check the entry point path" not in message


def test_start_error_names_the_rank_and_kills_started_workers():
    group = WorkerGroup()
    with pytest.raises(WorkerStartError, match=r"rank 1 \(/nonexistent/prog\)") as info:
        group.start(
            [
                WorkerSpec(0, py("import time; time.sleep(60)")),
                WorkerSpec(1, ["/nonexistent/prog"]),
            ]
        )
    assert isinstance(info.value, RallypointError)
    assert info.value.rank == 1
    assert group.exits[0].signal_name == "SIGKILL"
    assert not alive(group.pids[0])


def test_dropping_a_finished_group_reaps_its_workers():
    group = WorkerGroup()
    group.start([WorkerSpec(0, py("pass"))])
    assert group.wait(timeout=10) is not None
    pid = group.pids[0]
    assert Path(f"/proc/{pid}").exists() or sys.platform != "linux"  # a zombie until reaped
    # the watcher thread holds the group until its last statement is done
    assert wait_until(lambda: not any(t.name.startswith("rallypoint-worker-") for t in threading.enumerate()), 5)
    gc.collect()  # earlier tests' garbage (their warnings are not this group's)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del group
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
    assert not Path(f"/proc/{pid}").exists()


def test_unwritable_log_dir_is_reported_and_nothing_keeps_running(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    group = WorkerGroup(logs=WorkerLogs(blocker, host="h"))
    with pytest.raises(RallypointError, match=r"cannot write worker log .*rank_0\.log"):
        group.start([WorkerSpec(0, py("import time; time.sleep(60)"))])
    assert group.exits[0].signal_name == "SIGKILL"


def test_start_validation():
    group = WorkerGroup()
    with pytest.raises(ValueError, match="duplicate worker ranks"):
        group.start([WorkerSpec(0, py("pass")), WorkerSpec(0, py("pass"))])
    group.start([WorkerSpec(0, py("pass"))])
    with pytest.raises(ValueError, match="already started"):
        group.start([WorkerSpec(1, py("pass"))])
    group.stop(grace=5)


def test_empty_group():
    group = WorkerGroup()
    group.start([])
    assert group.wait(timeout=0) == {}
    assert group.wait_any(timeout=1) is None
    assert group.stop() == {}


def test_workers_survive_the_thread_that_started_them(tmp_path):
    # The worker waits until the starting thread is gone, then proves it is still running by
    # writing a file and exiting 0. A parent-death signal tied to the thread would have killed
    # it when the thread ended, before the "go" file existed.
    go, done = tmp_path / "go", tmp_path / "done"
    code = f"""
        import os, sys, time
        deadline = time.monotonic() + 60
        while not os.path.exists({str(go)!r}):
            if time.monotonic() > deadline:
                sys.exit(5)
            time.sleep(0.01)
        open({str(done)!r}, "w").close()
    """
    group = WorkerGroup()
    thread = threading.Thread(target=group.start, args=([WorkerSpec(0, py(code))],))
    thread.start()
    thread.join()
    try:
        go.touch()
        exits = group.wait(timeout=60)
        assert exits is not None
        assert exits[0].describe() == "exit code 0", "worker died with the thread that started it"
        assert done.exists()
    finally:
        group.stop(grace=0)


def test_child_that_missed_its_parent_death_kills_itself():
    # The race: the agent dies between fork and prctl. Simulate it by telling the hook to expect
    # a parent that is not ours; the child must kill itself before exec.
    hook = death_signal.make_preexec(parent_pid=os.getpid() + 1_000_000)
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"], preexec_fn=hook, start_new_session=True)
    try:
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()


AGENT = """
import os, sys, time
from rallypoint.agent.workers import WorkerGroup, WorkerSpec
group = WorkerGroup(pdeathsig=sys.argv[2] == "1")
group.start([WorkerSpec(r, [sys.executable, "-c", "import time; time.sleep(60)"]) for r in range(2)])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(" ".join(str(p) for p in group.pids.values()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


def run_agent_and_kill_it(tmp_path: Path, pdeathsig: bool) -> list[int]:
    pids_file = tmp_path / "pids"
    agent = subprocess.Popen([PY, "-c", AGENT, str(pids_file), "1" if pdeathsig else "0"])
    try:
        pids = [int(p) for p in wait_for_file(pids_file, timeout=20).split()]
        assert len(pids) == 2
        assert all(alive(p) for p in pids)
    finally:
        agent.kill()
        agent.wait(timeout=10)
    return pids


#: How long the kernel's parent-death signal may take to reach and end the workers.
ORPHAN_WINDOW = 10.0


def test_sigkilled_agent_leaves_no_orphans(tmp_path):
    pids = run_agent_and_kill_it(tmp_path, pdeathsig=True)
    assert wait_until(lambda: not any(alive(p) for p in pids), ORPHAN_WINDOW), "workers outlived their agent"


def test_without_pdeathsig_workers_would_be_orphaned(tmp_path):
    # The control experiment: proves the test above detects orphans. Without the parent-death
    # signal the workers are still alive at the end of a much shorter window (the agent is dead
    # and reaped by then, so nothing can still be on its way to them).
    pids = run_agent_and_kill_it(tmp_path, pdeathsig=False)
    try:
        assert not wait_until(lambda: not all(alive(p) for p in pids), 1.0)
        assert all(alive(p) for p in pids)
    finally:
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p, signal.SIGKILL)


# -- the whole worker tree (issue #11, item 7) ---------------------------------------------------

#: A worker that starts two grandchildren, one in its own process group and one in a process group
#: of its own (as a shell with job control does), writes their pids to argv[1] and sleeps.
TREE_WORKER = """
import os, subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
same = subprocess.Popen(sleep)
other = subprocess.Popen(sleep, process_group=0)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{same.pid} {other.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


def grandchildren(path: Path) -> list[int]:
    pids = [int(p) for p in wait_for_file(path, timeout=20).split()]
    assert len(pids) == 2
    assert all(alive(p) for p in pids)
    return pids


def kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_stop_kills_grandchildren_in_other_process_groups(tmp_path):
    # what a restart does to the previous attempt: nothing the worker started may survive
    group = WorkerGroup()
    group.start([WorkerSpec(0, [PY, "-c", TREE_WORKER, str(tmp_path / "tree")])])
    pids = grandchildren(tmp_path / "tree")
    try:
        group.stop(grace=0.5)
        assert wait_until(lambda: not any(alive(p) for p in pids), 10), "a grandchild outlived stop()"
    finally:
        kill_leftovers(pids)


def test_stop_kills_the_tree_of_a_worker_that_already_exited(tmp_path):
    code = TREE_WORKER.replace("time.sleep(120)\n", "") + "os._exit(0)\n"
    group = WorkerGroup()
    group.start([WorkerSpec(0, [PY, "-c", code, str(tmp_path / "tree")])])
    pids = grandchildren(tmp_path / "tree")
    try:
        event = group.wait_any(timeout=20)
        assert event is not None
        assert event.ok
        assert all(alive(p) for p in pids)
        group.stop(grace=0.5)
        assert wait_until(lambda: not any(alive(p) for p in pids), 10), "a grandchild outlived stop()"
    finally:
        kill_leftovers(pids)


TREE_AGENT = """
import os, sys
from rallypoint.agent.workers import WorkerGroup, WorkerSpec
group = WorkerGroup(pdeathsig=sys.argv[2] == "1")
group.start([WorkerSpec(0, [sys.executable, "-c", sys.argv[3], sys.argv[1]])])
import time
time.sleep(120)
"""


def run_tree_agent_and_kill_it(tmp_path: Path, pdeathsig: bool) -> list[int]:
    tree = tmp_path / "tree"
    agent = subprocess.Popen([PY, "-c", TREE_AGENT, str(tree), "1" if pdeathsig else "0", TREE_WORKER])
    try:
        pids = grandchildren(tree)
    finally:
        agent.kill()
        agent.wait(timeout=10)
    return pids


def test_sigkilled_agent_takes_the_workers_grandchildren_with_it(tmp_path):
    pids = run_tree_agent_and_kill_it(tmp_path, pdeathsig=True)
    try:
        assert wait_until(lambda: not any(alive(p) for p in pids), ORPHAN_WINDOW), (
            "processes started by a worker outlived their SIGKILLed agent"
        )
    finally:
        kill_leftovers(pids)


def test_without_the_sentinel_grandchildren_would_be_orphaned(tmp_path):
    # control experiment for the test above: it does detect surviving grandchildren
    pids = run_tree_agent_and_kill_it(tmp_path, pdeathsig=False)
    try:
        assert not wait_until(lambda: not all(alive(p) for p in pids), 1.0)
    finally:
        kill_leftovers(pids)


def test_kill_sessions_reaches_every_member_and_nobody_else(tmp_path):
    from rallypoint.agent.sentinel import kill_sessions, session_members

    bystander = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    worker = subprocess.Popen([PY, "-c", TREE_WORKER, str(tmp_path / "tree")], start_new_session=True)
    pids = grandchildren(tmp_path / "tree")
    try:
        members = {pid for pid, _, _ in session_members([worker.pid])}
        assert members == {worker.pid, *pids}
        kill_sessions([worker.pid])
        assert worker.wait(timeout=10) == -signal.SIGKILL
        assert wait_until(lambda: not any(alive(p) for p in pids), 10)
        assert bystander.poll() is None
    finally:
        kill_leftovers(pids)
        bystander.kill()
        bystander.wait()
        worker.kill()
        worker.wait()


def test_the_sentinel_kills_the_sessions_still_registered_when_its_pipe_closes(tmp_path):
    from rallypoint.agent import sentinel

    kept = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    doomed = subprocess.Popen([PY, "-c", TREE_WORKER, str(tmp_path / "tree")], start_new_session=True)
    pids = grandchildren(tmp_path / "tree")
    read_fd, write_fd = os.pipe()
    watcher = subprocess.Popen([PY, "-I", "-S", sentinel.__file__], stdin=read_fd, start_new_session=True)
    os.close(read_fd)
    try:
        os.write(write_fd, f"+{kept.pid}\n+{doomed.pid}\n-{kept.pid}\n".encode())
        time.sleep(0.2)  # the sentinel acts on end-of-file only: nothing may happen before
        assert doomed.poll() is None
        os.close(write_fd)  # what the kernel does when the agent dies
        assert watcher.wait(timeout=20) == 0
        assert doomed.wait(timeout=10) == -signal.SIGKILL
        assert wait_until(lambda: not any(alive(p) for p in pids), 10)
        assert kept.poll() is None  # unregistered: left alone
    finally:
        kill_leftovers(pids)
        for proc in (kept, doomed, watcher):
            proc.kill()
            proc.wait()


def test_a_sentinel_that_cannot_start_is_reported_once_and_stops_nothing(monkeypatch, capsys):
    monkeypatch.setattr(sys, "executable", "")
    watch = workers_mod._Sentinel()
    watch.register(12345)
    watch.register(12346)
    watch.unregister(12345)
    assert watch.process_id is None
    assert console.flush(10)  # agent messages are written by a thread of their own
    err = capsys.readouterr().err
    assert err.count("cannot start the worker sentinel (sys.executable is unknown)") == 1
    assert "may outlive an agent killed with SIGKILL" in err


def test_a_worker_that_sigkill_does_not_end_is_named_and_not_waited_for(monkeypatch, tmp_path):
    """A worker in state D outlives SIGKILL: stop() names it, says the host needs attention, and returns.

    Simulated: the kill of the sessions is replaced by nothing (the worker ignores SIGTERM), so the
    worker stays alive past SIGKILL as a process stuck in the kernel would. Before #40, stop()
    then waited for it forever (it reaped every worker before raising).
    """
    monkeypatch.setattr(workers_mod, "KILL_WAIT", 0.5)
    monkeypatch.setattr(workers_mod.sentinel, "kill_sessions", lambda sids: None)
    ready = tmp_path / "ready"
    code = READY + "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nready()\ntime.sleep(60)\n"
    group = WorkerGroup()
    group.start([WorkerSpec(rank=3, argv=[sys.executable, "-c", code, str(ready)])])
    pid = int(wait_for_file(ready))
    raised: list[BaseException] = []

    def stop() -> None:
        try:
            group.stop(grace=0.2)
        except RallypointError as exc:
            raised.append(exc)

    stopper = threading.Thread(target=stop, daemon=True)
    stopper.start()
    stopper.join(15)
    try:
        assert not stopper.is_alive(), "stop() waited for a worker that SIGKILL did not end"
        assert len(raised) == 1
        assert isinstance(raised[0], workers_mod.UnkillableWorkers)
        assert raised[0].pids == {3: pid}
        message = str(raised[0])
        assert f"rank 3 pid {pid} (state S, wchan " in message
        assert "this host needs attention" in message
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
