"""The ``hosts`` fixture cleans up after a failing and an interrupted test, and fails without privilege.

Each check runs an inner pytest session (in a process of its own) that uses the fixture:

* one inner test fails while it holds hosts with a process running in them, another is
  interrupted with SIGTERM (a cancelled CI job) while it holds some: afterwards no namespace,
  ``/etc/netns`` entry or process of theirs is left;
* run as an unprivileged user, a test that asks for hosts fails, naming the reason; it is not
  skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import netns
import pytest

HERE = Path(__file__).resolve().parent

INNER_CONFTEST = f"""
import importlib.util

_spec = importlib.util.spec_from_file_location("integration_conftest", {str(HERE / "conftest.py")!r})
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
hosts = _mod.hosts
"""

INNER_TESTS = """
import json, os, sys, time
from pathlib import Path

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def hold(hosts, count):
    net = hosts(count)
    sleeper = net.hosts[0].popen(SLEEP)
    deadline = time.monotonic() + 30
    while sleeper.pid not in net.hosts[0].pids() and not net.hosts[0].pids():
        assert time.monotonic() < deadline, "the sleeper never entered its namespace"
        time.sleep(0.01)
    return net, sleeper


def test_fails_while_holding_hosts(hosts):
    net, sleeper = hold(hosts, 2)
    note = {"namespaces": [h.ns for h in net.hosts] + [net.switch], "pids": net.hosts[0].pids()}
    Path(os.environ["NOTE_DIR"], "failed.json").write_text(json.dumps(note))
    raise AssertionError("this test fails on purpose")


def test_interrupted_while_holding_hosts(hosts):
    net, sleeper = hold(hosts, 2)
    note = {"namespaces": [h.ns for h in net.hosts] + [net.switch], "pids": net.hosts[0].pids()}
    Path(os.environ["NOTE_DIR"], "interrupted.json").write_text(json.dumps(note))
    time.sleep(600)  # until the outer test sends SIGTERM
"""

NEEDS_HOSTS = """
def test_needs_hosts(hosts):
    hosts(2)
"""


@pytest.fixture
def inner(tmp_path: Path) -> Iterator[Path]:
    """A directory for an inner pytest session, readable by every user (unlike tmp_path's parents)."""
    root = Path(tempfile.mkdtemp(prefix="rp-netns-inner-"))
    root.chmod(0o755)
    (root / "conftest.py").write_text(INNER_CONFTEST)
    (root / "pytest.ini").write_text("[pytest]\n")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def pytest_argv(root: Path, test_file: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-c",
            str(root / "pytest.ini"), "--rootdir", str(root), str(root / test_file)]  # fmt: skip


def test_hosts_are_torn_down_after_a_failure_and_an_interrupt(inner: Path) -> None:
    (inner / "test_inner.py").write_text(INNER_TESTS)
    env = {**os.environ, "NOTE_DIR": str(inner)}
    proc = subprocess.Popen(
        pytest_argv(inner, "test_inner.py"), cwd=inner, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (inner / "interrupted.json").exists():
            assert proc.poll() is None, f"the inner session ended early:\n{proc.communicate()[0]}"
            assert time.monotonic() < deadline, "the inner test never held its hosts"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "this test fails on purpose" in output
    assert "KeyboardInterrupt" in output or "Interrupted" in output, output[-3000:]
    for name in ("failed.json", "interrupted.json"):
        note = json.loads((inner / name).read_text())
        assert note["pids"], f"{name}: no process was in the host"
        assert not set(note["namespaces"]) & set(netns._namespaces()), f"{name}: namespaces left"
        assert not [pid for pid in note["pids"] if netns.process_alive(pid)], f"{name}: processes left"
    assert netns.leftovers(proc.pid) == []


def test_without_privilege_the_test_fails_with_the_reason(inner: Path) -> None:
    (inner / "test_needs_hosts.py").write_text(NEEDS_HOSTS)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    proc = subprocess.run(
        [*nobody, *pytest_argv(inner, "test_needs_hosts.py")],
        cwd=inner,
        env={**os.environ, "HOME": str(inner)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "cannot create namespace hosts: creating network namespaces needs root" in proc.stdout
    assert "1 failed" in proc.stdout
    assert "skipped" not in proc.stdout
