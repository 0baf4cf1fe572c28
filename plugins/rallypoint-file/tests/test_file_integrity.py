"""A run directory that is deleted, replaced, made read-only or corrupted while the job runs.

Each case must fail the node within ``heartbeat_timeout`` with the path named, not hang until the
join timeout (or forever).
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rallypoint.rendezvous.errors import RendezvousError, RendezvousStateError
from rallypoint.rendezvous.handler import RendezvousHandler
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts
from rallypoint_file.backend import CHECK_INTERVAL, FileBackend

#: The heartbeat timeout of the handler tests; the join timeout is far longer.
HEARTBEAT_TIMEOUT = 6.0


def write_lock(root: Path, data: bytes, *, truncate: bool = True) -> None:
    """Write ``data`` at the start of the lock file (the counter; the nonce follows it)."""
    fd = os.open(root / "lock", os.O_WRONLY)
    try:
        if truncate:
            os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


def rewind(root: Path, to: int) -> None:
    """Set the counter back to ``to``, keeping the lock file's format (what a stray writer might do)."""
    write_lock(root, b"%20d" % to, truncate=False)


def chattr(flag: str, path: Path) -> None:
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"chattr {flag} {path} failed (the tests run as root, as CI does): {done.stderr}")


@pytest.fixture
def immutable() -> Iterator[Callable[[Path], None]]:
    """``immutable(path)``: ``chattr +i`` it; always undone after the test."""
    done: list[Path] = []

    def make(path: Path) -> None:
        chattr("+i", path)
        done.append(path)

    yield make
    for path in done:
        chattr("-i", path)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs (so that it can be remounted read-only); always unmounted after the test."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.fail(f"cannot mount a tmpfs (the tests run as root, as CI does): {done.stderr.decode()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def raises_soon(call: Callable[[], object], within: float) -> BaseException:
    """Call ``call`` until it raises (at most ``within`` seconds); return the exception."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - returned to be asserted on
            return exc
        time.sleep(0.05)
    pytest.fail(f"no error within {within}s")


# -- the backend ------------------------------------------------------------------------------
def test_a_deleted_run_directory_fails_writes_at_once_and_reads_soon(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "job")
    backend.set("round/header", {"round": 0})
    shutil.rmtree(tmp_path / "job")
    with pytest.raises(RendezvousStateError, match=f"rendezvous directory {tmp_path / 'job'} of run 'job' was deleted"):
        backend.set("hb/node", 1)
    assert not (tmp_path / "job").exists()  # a write does not bring it back
    error = raises_soon(lambda: backend.get("round/header"), within=CHECK_INTERVAL + 2)
    assert isinstance(error, RendezvousStateError)
    assert "was deleted" in str(error)


def test_a_broken_run_directory_fails_every_later_call_not_only_the_one_that_found_it(
    tmp_path: Path, immutable: Callable[[Path], None]
) -> None:
    # The check runs at most once per CHECK_INTERVAL, shared by the node's threads. A thread that
    # swallows the error it gets (a service that retries, say) must not leave the others believing
    # the run directory is fine until the next check: the verdict is for good.
    backend = FileBackend(tmp_path, "job")
    backend.set("hb/node", 1)
    time.sleep(CHECK_INTERVAL)  # the next call checks
    immutable(tmp_path / "job")
    with pytest.raises(RendezvousStateError, match="can no longer be written"):
        backend.get("debug/request")  # found by a thread that ignores it
    started = time.monotonic()
    with pytest.raises(RendezvousStateError, match="can no longer be written"):
        backend.set("hb/node", 2)  # the heartbeat, right after
    assert time.monotonic() - started < CHECK_INTERVAL
    with pytest.raises(RendezvousStateError, match="can no longer be written"):
        backend.watch("round/header", version=None, timeout=5)


def test_a_replaced_run_directory_is_noticed(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "job")
    backend.set("round/header", {"round": 3})
    shutil.rmtree(tmp_path / "job")
    FileBackend(tmp_path, "job").set("round/header", {"round": 0})  # someone starts over in its place
    with pytest.raises(RendezvousStateError, match=f"{tmp_path / 'job'} of run 'job' was replaced"):
        backend.set("hb/node", 1)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda root: write_lock(root, b"garbage"), "is corrupt"),
        (lambda root: write_lock(root, b""), "is corrupt"),
        (lambda root: rewind(root, 1), "went back from 3 to 1"),
    ],
    ids=["garbage", "truncated", "rewound"],
)
def test_a_corrupt_revision_counter_is_named(tmp_path: Path, damage: Callable[[Path], None], problem: str) -> None:
    backend = FileBackend(tmp_path, "job")
    for i in range(3):
        backend.set("k", i)
    damage(tmp_path / "job")
    with pytest.raises(RendezvousStateError, match=f"revision counter in {tmp_path / 'job' / 'lock'} {problem}"):
        backend.set("k", 9)


def test_a_watch_fails_instead_of_waiting_out_its_timeout(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "job")
    backend.set("k", 1)
    entry = backend.get("k")
    assert entry is not None
    errors: queue.Queue[BaseException | None] = queue.Queue()

    def watch() -> None:
        try:
            backend.watch("k", version=entry.version, timeout=120)
            errors.put(None)
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            errors.put(exc)

    threading.Thread(target=watch, daemon=True).start()
    time.sleep(0.2)  # let it start polling (not a synchronisation: the outcome is the same if it has not)
    shutil.rmtree(tmp_path / "job")
    error = errors.get(timeout=CHECK_INTERVAL + 5)
    assert isinstance(error, RendezvousStateError)
    assert f"{tmp_path / 'job'} of run 'job' was deleted" in str(error)


def test_an_immutable_run_directory_is_noticed(tmp_path: Path, immutable: Callable[[Path], None]) -> None:
    backend = FileBackend(tmp_path, "job")
    backend.set("k", 1)
    immutable(tmp_path / "job" / "kv")
    kv = tmp_path / "job" / "kv"
    # a state error, not a backend outage: the agent rides out outages while workers run
    with pytest.raises(RendezvousStateError, match=f"{kv} of run 'job' can no longer be written"):
        backend.check_intact()
    error = raises_soon(lambda: backend.get("k"), within=CHECK_INTERVAL + 2)
    assert "can no longer be written" in str(error)


# -- a node waiting for its round ----------------------------------------------------------------
def _corrupt(root: Path) -> None:
    write_lock(root, b"not a number")


def _rewind(root: Path) -> None:
    rewind(root, 0)


def _delete(root: Path) -> None:
    shutil.rmtree(root)


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "deleted": (_delete, "{root} of run 'job' was deleted"),
    "counter-corrupt": (_corrupt, "revision counter in {root}/lock is corrupt"),
    "counter-rewound": (_rewind, "revision counter in {root}/lock went back"),
}


def wait_in_join(base: Path) -> tuple[RendezvousHandler, queue.Queue[BaseException | None]]:
    """A node that waits for a second one (join timeout 300 s); its outcome goes to the queue."""
    timeouts = RendezvousTimeouts(join=300, heartbeat_interval=1, heartbeat_timeout=HEARTBEAT_TIMEOUT)
    handler = RendezvousHandler(FileBackend(base, "job"), make_node(0), min_nodes=2, max_nodes=2, timeouts=timeouts)
    outcome: queue.Queue[BaseException | None] = queue.Queue()

    def join() -> None:
        try:
            handler.next_rendezvous()
            outcome.put(None)
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            outcome.put(exc)

    threading.Thread(target=join, daemon=True).start()
    observer = FileBackend(base, "job")
    deadline = time.monotonic() + 30
    while not observer.list("join/"):
        assert time.monotonic() < deadline, "the node never joined"
        time.sleep(0.02)
    return handler, outcome


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_waiting_node_fails_within_the_heartbeat_timeout(tmp_path: Path, case: str) -> None:
    damage, expected = CASES[case]
    handler, outcome = wait_in_join(tmp_path)
    try:
        damage(tmp_path / "job")
        error = outcome.get(timeout=HEARTBEAT_TIMEOUT)
    finally:
        handler.shutdown()
    assert isinstance(error, RendezvousStateError), error
    assert expected.format(root=tmp_path / "job") in str(error)


def test_a_waiting_node_fails_when_its_directory_turns_read_only(tmpfs: Path) -> None:
    handler, outcome = wait_in_join(tmpfs)
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
        error = outcome.get(timeout=HEARTBEAT_TIMEOUT)
    finally:
        handler.shutdown()
    assert isinstance(error, RendezvousError), error
    assert f"rendezvous directory {tmpfs / 'job'} of run 'job' can no longer be written" in str(error)
