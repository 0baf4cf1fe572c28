"""Unit tests of the watchdog core, its transports and its plugin registration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rallypoint.core.builtin import CLI_COMMANDS
from rallypoint.core.plugins import get_plugin_manager
from rallypoint.timer import Expiry, WatchdogError, WatchdogServer, configure, expires, get_client
from rallypoint.timer.backends import (
    ENV_TIMER_FILE,
    FileTimerClient,
    FileWatchdog,
    LocalWatchdog,
    client_from_env,
)
from rallypoint.timer.options import FileOptions, LocalOptions
from rallypoint.timer.records import TIMER_BACKENDS

BACKENDS = {"file": FileWatchdog, "local": LocalWatchdog}


class Collector:
    """An expiry handler that records what it is called with, and when (epoch seconds)."""

    def __init__(self) -> None:
        self.expiries: list[Expiry] = []
        self.called_at: list[float] = []
        self.event = threading.Event()
        self._cond = threading.Condition()

    def __call__(self, expiry: Expiry) -> None:
        with self._cond:
            self.called_at.append(time.time())
            self.expiries.append(expiry)
            self._cond.notify_all()
        self.event.set()

    def wait_for_scope(self, scope: str, timeout: float = 10) -> None:
        """Block until an expiry of ``scope`` has been handled."""
        with self._cond:
            assert self._cond.wait_for(lambda: any(e.scope == scope for e in self.expiries), timeout), self.expiries


def _sentinel_process() -> subprocess.Popen[bytes]:
    """A live process other than this one, whose timer marks a point in the server's timeline."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def _wait_until(predicate: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_plugin_registers_local_file_and_the_timeline_command() -> None:
    pm = get_plugin_manager(autoload=False)
    timers = pm.registry(TIMER_BACKENDS)
    local, file = timers.get("local"), timers.get("file")
    assert local.load() is LocalWatchdog
    assert file.load() is FileWatchdog
    assert (local.options_model, file.options_model) == (LocalOptions, FileOptions)
    assert pm.registry(CLI_COMMANDS).get("timeline").load().name == "timeline"


def test_import_is_light() -> None:
    code = "import sys, rallypoint.timer; print('torch' in sys.modules, 'pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_core_expires_calls_the_handler_once_per_pid_with_the_earliest_scope() -> None:
    server = WatchdogServer(gc_interval=0.05)
    got = Collector()
    server.set_expiry_handler(got)
    sentinel = _sentinel_process()
    now = time.time()
    pid = os.getpid()  # alive, so the garbage collector keeps its timers
    server.submit({"pid": pid, "scope_id": "late", "expiration_time": now + 0.2, "rank": 2})
    server.submit({"pid": pid, "scope_id": "early", "expiration_time": now + 0.1, "rank": 2, "acquired_at": now})
    server.submit({"pid": pid, "scope_id": "released", "expiration_time": now + 0.05})
    server.submit({"pid": pid, "scope_id": "released", "expiration_time": -1})
    # Expiries are handled in deadline order: once the sentinel's (after "late") is handled,
    # a second expiry of this pid would have been handled before it.
    server.submit({"pid": sentinel.pid, "scope_id": "sentinel", "expiration_time": now + 0.3})
    try:
        got.wait_for_scope("sentinel")
        assert [e.scope for e in got.expiries] == ["early", "sentinel"], got.expiries
        e = got.expiries[0]
        assert (e.pid, e.rank, e.scope, e.signal) == (pid, 2, "early", signal.SIGKILL)
        assert e.deadline == pytest.approx(now + 0.1)
        assert e.acquired_at == pytest.approx(now)
        assert "'early'" in e.describe()
        assert "rank 2" in e.describe()
        assert server.active_timers() == {}
    finally:
        sentinel.kill()
        sentinel.wait()
        server.stop()


def test_core_detects_expiry_promptly_without_polling() -> None:
    """The server sleeps until the earliest deadline: it does not wait for its next sweep.

    A server that only looked at its timers every ``gc_interval`` (60 s) would be a minute late;
    the bound, a twelfth of that, leaves room for a loaded machine and still tells them apart.
    """
    gc_interval = 60.0
    server = WatchdogServer(gc_interval=gc_interval)
    got = Collector()
    server.set_expiry_handler(got)
    deadline = time.time() + 0.1
    server.submit({"pid": os.getpid(), "scope_id": "s", "expiration_time": deadline})
    try:
        got.wait_for_scope("s", timeout=2 * gc_interval)
        assert deadline <= got.called_at[0] < deadline + gc_interval / 12
    finally:
        server.stop()


def test_signal_zero_never_kills_and_dead_pids_are_forgotten() -> None:
    server = WatchdogServer(gc_interval=0.05)
    got = Collector()
    server.set_expiry_handler(got)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    sentinel = _sentinel_process()
    now = time.time()
    server.submit({"pid": os.getpid(), "scope_id": "soft", "expiration_time": now + 0.05, "signal": 0})
    server.submit({"pid": dead.pid, "scope_id": "gone", "expiration_time": now + 60})
    # handled after "soft" is due: an expiry of "soft" would come first
    server.submit({"pid": sentinel.pid, "scope_id": "sentinel", "expiration_time": now + 0.1})
    try:
        got.wait_for_scope("sentinel")
        assert [e.scope for e in got.expiries] == ["sentinel"]
        assert _wait_until(lambda: server.active_timers() == {}), server.active_timers()
    finally:
        sentinel.kill()
        sentinel.wait()
        server.stop()


def test_without_a_handler_the_server_kills_the_pid(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    server = WatchdogServer()
    try:
        server.submit({"pid": proc.pid, "scope_id": "x", "expiration_time": time.time() + 0.05})
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
        server.stop()


def test_malformed_requests_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    server = WatchdogServer()
    try:
        for line in (b"{", b"[1]", b'{"pid": 1}', b'{"pid": "x", "scope_id": "s", "expiration_time": 1}'):
            server.submit_line(line)
        assert server.active_timers() == {}
        assert "malformed" in caplog.text
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("name", "options"), [("file", FileOptions(gc_interval=5)), ("local", LocalOptions(gc_interval=5))]
)
def test_transport_carries_acquire_and_release(tmp_path: Path, name: str, options: LocalOptions) -> None:
    server = BACKENDS[name].start_server(tmp_path, options)
    try:
        env = server.worker_env(rank=4)
        assert env["RALLYPOINT_WATCHDOG_BACKEND"] == name
        assert not any(k.startswith("RALLYPOINT_TIMER_") for k in env)
        client = client_from_env(env)
        client.acquire("a", time.time() + 60)
        client.acquire("b", time.time() + 60)
        client.release("a")
        _wait_until(lambda: set(server.active_timers()) == {(os.getpid(), "b")})
        assert set(server.active_timers()) == {(os.getpid(), "b")}
    finally:
        server.stop()
    assert not any(tmp_path.iterdir()), "the FIFO / socket is removed on stop"


def test_file_server_accepts_torch_lines_and_names_rank_from_the_pid_hint(tmp_path: Path) -> None:
    server = FileWatchdog.start_server(tmp_path, FileOptions(path=str(tmp_path / "wd")))
    got = Collector()
    server.set_expiry_handler(got)
    env = server.worker_env(rank=7, pid_hint=os.getpid())
    assert env[ENV_TIMER_FILE] == str(tmp_path / "wd")
    line = {"version": 1, "pid": os.getpid(), "scope_id": "t", "expiration_time": time.time() + 0.05, "signal": 9}
    fd = os.open(env[ENV_TIMER_FILE], os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, json.dumps(line).encode() + b"\n")
        assert got.event.wait(5)
        assert (got.expiries[0].rank, got.expiries[0].scope) == (7, "t")
    finally:
        os.close(fd)
        server.stop()


@pytest.mark.parametrize("name", ["file", "local"])
def test_servers_take_their_validated_options_as_given(tmp_path: Path, name: str) -> None:
    """``[timer.options]`` were validated by config resolution: a raw table is a programming error."""
    backend = BACKENDS[name]
    with pytest.raises(TypeError, match=r"validated (File|Local)Options, got dict"):
        backend.start_server(tmp_path, {"gc_interval": 5})
    server = backend.start_server(tmp_path, None)
    try:
        assert server._gc_interval == LocalOptions().gc_interval  # the model's defaults
    finally:
        server.stop()
    given = (FileOptions if name == "file" else LocalOptions)(gc_interval=7)
    server = backend.start_server(tmp_path, given)
    try:
        assert server._gc_interval == 7
    finally:
        server.stop()


def test_file_client_without_server_is_unavailable(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(BrokenPipeError, match="not available"):
        FileTimerClient(tmp_path / "fifo").acquire("x", time.time() + 1)


def test_client_from_env_errors_name_the_variables() -> None:
    with pytest.raises(WatchdogError, match="TORCHELASTIC_TIMER_FILE"):
        client_from_env({})
    with pytest.raises(WatchdogError, match="RALLYPOINT_WATCHDOG_ADDRESS"):
        client_from_env({"RALLYPOINT_WATCHDOG_BACKEND": "local"})
    with pytest.raises(WatchdogError, match="unknown watchdog backend 'nope'"):
        client_from_env({"RALLYPOINT_WATCHDOG_BACKEND": "nope"})


def test_expires_acquires_releases_and_defaults_the_scope_to_the_caller() -> None:
    calls: list[tuple[str, str, float | None]] = []

    class Fake:
        def acquire(self, scope_id: str, expiration_time: float) -> None:
            calls.append(("acquire", scope_id, expiration_time))

        def release(self, scope_id: str) -> None:
            calls.append(("release", scope_id, None))

    configure(Fake())
    try:
        assert isinstance(get_client(), Fake)
        with pytest.raises(KeyError), expires(after=5):
            raise KeyError
        with expires(after=1, scope="named"):
            pass
    finally:
        configure(None)
    (kind, scope, exp), (kind2, scope2, _), (_, named, _), _ = calls
    assert (kind, kind2, scope, scope2) == ("acquire", "release", scope, scope)
    assert scope.startswith(__file__ + "#")
    assert exp == pytest.approx(time.time() + 5, abs=1)
    assert named == "named"
    with pytest.raises(WatchdogError, match="after must be >= 0"), expires(after=-1, client=Fake()):
        pass


def test_stop_is_idempotent_and_requests_after_stop_are_ignored(tmp_path: Path) -> None:
    server = LocalWatchdog.start_server(tmp_path)
    server.stop()
    server.stop()
    server.submit({"pid": 1, "scope_id": "s", "expiration_time": time.time()})
    assert server.active_timers() == {}
    assert not server.running
