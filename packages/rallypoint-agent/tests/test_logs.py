"""Tests of rallypoint.agent.logs: files per attempt, console tee, stderr tail (real processes)."""

from __future__ import annotations

import fcntl
import io
import os
import re
import sys
import termios
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rallypoint.agent import console as console_lanes
from rallypoint.agent.logs import WorkerLogs, parse_tee, tee_selects
from rallypoint.agent.workers import WorkerGroup, WorkerSpec
from rallypoint.core.errors import RallypointError

PY = sys.executable


def py(code: str) -> list[str]:
    return [PY, "-u", "-c", textwrap.dedent(code)]


class Console(io.StringIO):
    """A console stream that tests can read from while readers write."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, s: str) -> int:
        with self.lock:
            return super().write(s)

    def text(self) -> str:
        with self.lock:
            return self.getvalue()


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def unread(fd: int) -> int:
    """Bytes waiting in a pipe that its reader has not taken yet."""
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)


def file_is(path: Path, content: bytes) -> Callable[[], bool]:
    return lambda: path.exists() and path.read_bytes() == content


def run(specs, logs: WorkerLogs, timeout: float = 60.0):
    group = WorkerGroup(logs=logs)
    group.start(specs)
    exits = group.wait(timeout=timeout)
    assert exits is not None
    assert logs.wait_drained(timeout=30)
    group.stop(grace=1)
    assert logs.close(timeout=30)
    assert console_lanes.flush(30)  # the console lines are written by a thread of their own
    return exits


def test_nothing_is_lost_when_a_worker_is_killed(tmp_path):
    code = """
        import os, signal, sys
        for i in range(3000):
            print(f"out {i}")
            if i % 100 == 0:
                print(f"err {i}", file=sys.stderr)
        os.kill(os.getpid(), signal.SIGKILL)
    """
    logs = WorkerLogs(tmp_path, attempt=2, host="h", tee="none")
    exits = run([WorkerSpec(0, py(code)), WorkerSpec(1, py(code))], logs)
    for rank in (0, 1):
        assert exits[rank].signal_name == "SIGKILL"
        path = tmp_path / "attempt_2" / f"rank_{rank}.log"
        assert logs.log_path(rank) == path
        lines = path.read_text().splitlines()
        assert [ln for ln in lines if ln.startswith("out ")] == [f"out {i}" for i in range(3000)]
        assert [ln for ln in lines if ln.startswith("err ")] == [f"err {i}" for i in range(0, 3000, 100)]
        assert len(lines) == 3030  # whole lines only: stdout and stderr never mix inside a line


def test_console_prefix_and_stream_routing(tmp_path):
    out, err = Console(), Console()
    logs = WorkerLogs(tmp_path, host="node-a", tee="all", console_out=out, console_err=err)
    code = "import sys; print('hello'); print('oops', file=sys.stderr); sys.stdout.write('no newline')"
    run([WorkerSpec(0, py(code)), WorkerSpec(5, py(code))], logs)
    for rank in (0, 5):
        assert f"[node-a:{rank}] hello\n" in out.text()
        assert f"[node-a:{rank}] no newline\n" in out.text()
        assert f"[node-a:{rank}] oops\n" in err.text()
        assert "oops" not in out.text()
        # the file keeps the raw bytes: no prefix, the partial last line as written
        content = (tmp_path / "attempt_0" / f"rank_{rank}.log").read_text()
        assert sorted(content.splitlines()) == ["hello", "no newline", "oops"]
        assert content.index("hello") < content.index("no newline")
        assert "[node-a" not in content


@pytest.mark.parametrize(
    ("tee", "shown"),
    [("all", {0, 1, 2}), ("rank0", {0}), ("none", set()), ([1, 2], {1, 2}), ("2", {2})],
)
def test_tee_filters_the_console_not_the_files(tmp_path, tee, shown):
    out = Console()
    logs = WorkerLogs(tmp_path, host="h", tee=tee, console_out=out, console_err=out)
    run([WorkerSpec(r, py(f"print('line from {r}')")) for r in range(3)], logs)
    for r in range(3):
        assert (f"[h:{r}] line from {r}" in out.text()) == (r in shown)
        assert (tmp_path / "attempt_0" / f"rank_{r}.log").read_text() == f"line from {r}\n"


def test_stderr_tail_keeps_the_last_lines(tmp_path):
    code = """
        import sys
        for i in range(200):
            print(f"e{i}", file=sys.stderr)
            print(f"o{i}")
        raise SystemExit(1)
    """
    logs = WorkerLogs(None, host="h", tee="none", tail_lines=50)
    exits = run([WorkerSpec(0, py(code))], logs)
    assert exits[0].returncode == 1
    assert logs.log_path(0) is None
    assert logs.stderr_tail(0) == [f"e{i}" for i in range(150, 200)]
    assert logs.stderr_tail(0, 3) == ["e197", "e198", "e199"]
    assert logs.stderr_tail(0, 0) == []
    assert logs.stderr_tail(9) == []


def test_lines_arrive_promptly_while_the_worker_runs(tmp_path):
    out = Console()
    logs = WorkerLogs(tmp_path, host="h", tee="all", console_out=out)
    group = WorkerGroup(logs=logs)
    group.start([WorkerSpec(0, py("import time; print('started'); time.sleep(60)"))])
    try:
        path = tmp_path / "attempt_0" / "rank_0.log"
        # the line arrives while the worker still runs (it sleeps 60 s): no wait for its exit
        wait_until(file_is(path, b"started\n"), "the line is in the log file")
        wait_until(lambda: "[h:0] started\n" in out.text(), "the line is on the console")
        assert group.running() == [0]
    finally:
        group.stop(grace=0)
    assert logs.close(timeout=30)


def test_partial_lines_of_the_two_streams_do_not_mix(tmp_path):
    logs = WorkerLogs(tmp_path, host="h", tee="none")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    logs.attach(0, out_r, err_r)
    log = tmp_path / "attempt_0" / "rank_0.log"
    os.write(out_w, b"partial")
    wait_until(lambda: unread(out_r) == 0, "the stdout reader took the partial line")
    os.write(err_w, b"whole\n")
    wait_until(file_is(log, b"whole\n"), "the stderr line is in the file")
    os.write(out_w, b" continued\n")
    os.close(out_w)
    os.close(err_w)
    assert logs.close(timeout=30)
    # a partial line is held until its newline, so the stdout line arrives whole
    assert (tmp_path / "attempt_0" / "rank_0.log").read_bytes() == b"whole\npartial continued\n"


def test_partial_last_line_gets_a_newline_before_the_other_stream(tmp_path):
    logs = WorkerLogs(tmp_path, host="h", tee="none")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    logs.attach(0, out_r, err_r)
    log = tmp_path / "attempt_0" / "rank_0.log"
    os.write(out_w, b"last words")
    os.close(out_w)  # end-of-file flushes the partial line
    wait_until(file_is(log, b"last words"), "end-of-file flushed the partial line")
    os.write(err_w, b"after\n")
    os.close(err_w)
    assert logs.close(timeout=30)
    assert (tmp_path / "attempt_0" / "rank_0.log").read_bytes() == b"last words\nafter\n"


def test_non_utf8_output_is_kept_raw_in_the_file(tmp_path):
    out = Console()
    logs = WorkerLogs(tmp_path, host="h", console_out=out)
    run([WorkerSpec(0, py(r"import sys; sys.stdout.buffer.write(b'\xff\xfe bad\n')"))], logs)
    assert (tmp_path / "attempt_0" / "rank_0.log").read_bytes() == b"\xff\xfe bad\n"
    assert "[h:0] \ufffd\ufffd bad\n" in out.text()


def test_attach_twice_is_refused(tmp_path):
    logs = WorkerLogs(tmp_path, host="h")
    r, w = os.pipe()
    logs.attach(0, r, None)
    os.close(w)
    with pytest.raises(ValueError, match="rank 0 is already attached"):
        logs.attach(0, None, None)
    assert logs.close(timeout=30)


def test_parse_tee_and_tee_selects():
    assert parse_tee("ALL") == "all"
    assert parse_tee(" rank0 ") == "rank0"
    assert parse_tee("none") == "none"
    assert parse_tee("0, 3") == (0, 3)
    assert parse_tee([1, 2]) == (1, 2)
    with pytest.raises(ValueError, match="invalid tee value 'some'"):
        parse_tee("some")
    with pytest.raises(ValueError, match="must hold integers"):
        parse_tee(["a"])  # type: ignore[list-item]
    assert tee_selects("all", 7)
    assert not tee_selects("none", 0)
    assert tee_selects("rank0", 0)
    assert not tee_selects("rank0", 1)
    assert tee_selects((1, 3), 3)
    assert not tee_selects((1, 3), 2)


# -- a console that is not read (issue #11, item 6) ---------------------------------------------

#: What the chatty workers below write: 200,000 numbered lines, 100 bytes each (20 MB).
CHATTY_LINES = 200_000


def chatty_output() -> bytes:
    return b"".join(b"line %08d " % i + b"x" * 82 + b"\n" for i in range(CHATTY_LINES))


def chatty_worker(done: Path, then: str = "") -> list[str]:
    """A worker writing :func:`chatty_output` to stdout in 1 MB blocks, then creating ``done``."""
    return py(f"""
        import sys, time
        lines = [b"line %08d " % i + b"x" * 82 + b"\\n" for i in range({CHATTY_LINES})]
        for start in range(0, len(lines), 10_000):
            sys.stdout.buffer.write(b"".join(lines[start:start + 10_000]))
        sys.stdout.flush()
        open({str(done)!r}, "w").close()
        {then}
    """)


class StuckConsole:
    """A console on a pipe that nobody reads until :meth:`read_all` (a stalled ssh session, Ctrl-S)."""

    def __init__(self) -> None:
        self.read_fd, write_fd = os.pipe()
        self.stream = os.fdopen(write_fd, "w")
        self.data = bytearray()
        self.reader: threading.Thread | None = None

    def start_reading(self) -> None:
        def drain() -> None:
            while chunk := os.read(self.read_fd, 1 << 20):
                self.data += chunk

        self.reader = threading.Thread(target=drain, daemon=True)
        self.reader.start()

    def read_all(self) -> str:
        """Close the write end (after the logs wrote all they will) and return what was written."""
        if self.reader is None:
            self.start_reading()
        assert self.reader is not None
        self.stream.close()
        self.reader.join(30)
        os.close(self.read_fd)
        return self.data.decode()


def assert_console_accounts_for_every_line(text: str, path: Path) -> None:
    shown = sum(1 for line in text.splitlines() if line.startswith("[h:0] line "))
    notices = re.findall(
        r"\[rallypoint\] console fell behind: (\d+) lines from rank 0 not shown \(complete in (.+)\)", text
    )
    assert notices, "no drop notice on the console"
    assert {where for _, where in notices} == {str(path)}
    assert shown + sum(int(n) for n, _ in notices) == CHATTY_LINES
    assert shown < CHATTY_LINES


def test_a_console_nobody_reads_never_blocks_the_worker_and_the_file_is_complete(tmp_path):
    console = StuckConsole()
    logs = WorkerLogs(tmp_path, host="h", tee="all", console_out=console.stream)
    group = WorkerGroup(logs=logs)
    group.start([WorkerSpec(0, chatty_worker(tmp_path / "done"))])
    try:
        # the console pipe holds 64 KiB: the worker gets through 20 MB only if nothing waits for it
        exits = group.wait(timeout=60)
        assert exits is not None, "the worker was blocked by a console that nobody reads"
        assert exits[0].ok
        assert logs.wait_drained(timeout=30)
        path = logs.log_path(0)
        assert path is not None
        assert path.read_bytes() == chatty_output()
    finally:
        console.start_reading()  # unblock whatever waits on the console
        group.stop(grace=0)
        logs.close(timeout=60)
        assert console_lanes.flush(60)
    assert_console_accounts_for_every_line(console.read_all(), path)


def test_a_worker_killed_while_the_console_is_stuck_leaves_a_complete_log(tmp_path):
    console = StuckConsole()
    logs = WorkerLogs(tmp_path, host="h", tee="all", console_out=console.stream)
    group = WorkerGroup(logs=logs)
    done = tmp_path / "done"
    group.start([WorkerSpec(0, chatty_worker(done, then="time.sleep(60)"))])
    try:
        wait_until(done.exists, "the worker wrote all its output", timeout=60)
        group.stop(grace=0)  # the crash: SIGKILL
        assert group.exits[0].signal_name == "SIGKILL"
        assert logs.wait_drained(timeout=30)
        path = logs.log_path(0)
        assert path is not None
        assert path.read_bytes() == chatty_output()
    finally:
        console.start_reading()
        group.stop(grace=0)
        logs.close(timeout=60)
        assert console_lanes.flush(60)
    assert_console_accounts_for_every_line(console.read_all(), path)


def test_a_stuck_stdout_does_not_hold_up_worker_stderr_on_the_console(tmp_path):
    console, err = StuckConsole(), Console()
    logs = WorkerLogs(tmp_path, host="h", tee="all", console_out=console.stream, console_err=err)
    group = WorkerGroup(logs=logs)
    group.start([WorkerSpec(0, chatty_worker(tmp_path / "done", then="print('after', file=sys.stderr)"))])
    try:
        wait_until(lambda: "[h:0] after\n" in err.text(), "the stderr line reached its console")
    finally:
        console.start_reading()
        group.stop(grace=0)
        logs.close(timeout=60)
        assert console_lanes.flush(60)
    console.read_all()


# -- files never reached through a link, never overwritten (issue #35, item 6) -------------------


def test_a_rank_that_runs_again_in_the_same_attempt_keeps_its_earlier_log(tmp_path):
    """A new round without a restart counted runs the same attempt again: the earlier log stays."""
    for word in ("first", "second", "third"):
        logs = WorkerLogs(tmp_path, host="h", tee="none")
        run([WorkerSpec(0, py(f"print('{word}')"))], logs)
    attempt = tmp_path / "attempt_0"
    assert (attempt / "rank_0.log").read_text() == "first\n"
    assert (attempt / "rank_0.1.log").read_text() == "second\n"
    assert (attempt / "rank_0.2.log").read_text() == "third\n"
    assert logs.log_path(0) == attempt / "rank_0.2.log"  # what the report names


def test_log_files_and_directories_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        run([WorkerSpec(0, py("print('x')"))], WorkerLogs(tmp_path / "new" / "logs", host="h", tee="none"))
    finally:
        os.umask(old)
    for path in [tmp_path / "new", tmp_path / "new" / "logs", *(tmp_path / "new").rglob("*")]:
        mode = path.lstat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {mode:04o}"


def test_a_link_in_a_log_file_s_place_is_refused_and_not_followed(tmp_path):
    target = tmp_path / "target"
    target.write_text("untouched\n")
    (tmp_path / "logs" / "attempt_0").mkdir(parents=True, mode=0o700)
    (tmp_path / "logs").chmod(0o700)
    (tmp_path / "logs" / "attempt_0" / "rank_0.log").symlink_to(target)
    logs = WorkerLogs(tmp_path / "logs", host="h", tee="none")
    group = WorkerGroup(logs=logs)
    with pytest.raises(RallypointError, match=r"rank_0\.log is a symbolic link owned by uid 0 \(root\)"):
        group.start([WorkerSpec(0, py("print('overwritten')"))])
    group.stop(grace=0)
    assert target.read_text() == "untouched\n"
