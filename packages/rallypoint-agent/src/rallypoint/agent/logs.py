"""Worker output: per-attempt log files, the console tee and the stderr tail.

Each worker's stdout and stderr are pipes. One reader thread per pipe blocks in ``os.read`` and,
for every complete line, at once:

* appends the raw bytes to ``<log_dir>/attempt_<N>/rank_<R>.log`` (stdout and stderr together,
  in arrival order, whole lines only so the two streams never mix inside a line: a partial line
  left by one stream gets a newline before the other stream's next line; the file is unbuffered,
  so a line is on disk as soon as it is read);
* when ``tee`` selects the rank, queues ``[<host>:<rank>] <line>`` for the console (worker stdout
  to the agent's stdout, worker stderr to the agent's stderr) without waiting for it: a console
  that is not read never blocks a reader, hence never a worker (:mod:`rallypoint.agent.console`
  writes it, and drops lines it cannot keep up with, saying how many and where they are kept);
* for stderr, keeps the line in a bounded tail for the failure report.

There is no polling: a line written by a worker reaches the file and the console queue as soon as
the kernel hands it over. A worker killed by a signal loses nothing it already wrote to the pipe:
the readers drain the pipe to end-of-file. (What the worker still held in its *own* buffers is
lost with it; run Python workers with ``-u`` or ``PYTHONUNBUFFERED=1``, as torchrun does.)

A partial line is held until its newline, end-of-file, or 64 KiB, whichever comes first.
"""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Literal, TextIO, TypeAlias

from rallypoint.agent import console
from rallypoint.agent.log_dir import create_file, private_dir
from rallypoint.core.errors import RallypointError

__all__ = [
    "DEFAULT_TAIL_LINES",
    "Tee",
    "WorkerLogs",
    "parse_tee",
    "tee_selects",
]

#: A console filter: every rank, rank 0 only, none, or an explicit set of global ranks.
Tee: TypeAlias = Literal["all", "rank0", "none"] | Sequence[int]
#: Lines of stderr kept per worker for the failure report.
DEFAULT_TAIL_LINES = 50
_CHUNK = 65536
_MAX_NAMES = 1000
_MAX_PARTIAL = 65536


def parse_tee(value: str | Sequence[int]) -> Tee:
    """Normalise a ``tee`` setting.

    Accepts ``"all"``, ``"rank0"``, ``"none"``, a comma-separated string of global ranks
    (``"0,3"``) or a sequence of ints. Raises :class:`ValueError` with the accepted forms
    otherwise.
    """
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("all", "rank0", "none"):
            return text  # type: ignore[return-value]
        try:
            return tuple(int(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise ValueError(
                f"invalid tee value {value!r}: use 'all', 'rank0', 'none' or a list of global ranks like '0,3'"
            ) from None
    ranks = tuple(value)
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise ValueError(f"invalid tee value {value!r}: a list of tee ranks must hold integers")
    return ranks


def tee_selects(tee: Tee, rank: int) -> bool:
    """Return whether console output of global ``rank`` is shown under ``tee``."""
    if tee == "all":
        return True
    if tee == "none":
        return False
    if tee == "rank0":
        return rank == 0
    return rank in tee


class _RankState:
    """Per-worker state shared by its two reader threads."""

    def __init__(self, rank: int, file: IO[bytes] | None, tail_lines: int) -> None:
        self.rank = rank
        self.file = file
        self.file_lock = threading.Lock()
        #: Which stream (True: stderr) left the file in the middle of a line, if any.
        self.mid_line: bool | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.tail_lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.open_streams = 0


class WorkerLogs:
    """Collects the output of one attempt's workers.

    Args:
        log_dir: root log directory; files go to ``<log_dir>/attempt_<attempt>/rank_<R>.log``
            (``rank_<R>.<k>.log`` when that name is taken: nothing is overwritten). Directories
            and files are created private and never through a link
            (:mod:`rallypoint.agent.log_dir`). ``None`` writes no files; the console tee and
            stderr tail still work.
        attempt: the restart attempt number (0 for the first run).
        host: host name used in console prefixes; the local host name by default.
        tee: which global ranks reach the console (see :data:`Tee`).
        tail_lines: how many stderr lines to keep per worker.
        console_out: stream for worker stdout lines; ``sys.stdout`` at the time of writing by
            default.
        console_err: stream for worker stderr lines; ``sys.stderr`` at the time of writing by
            default.
        prefixes: each global rank's console prefix (``agent.line_prefix``); ``[host:rank] `` by default.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None,
        attempt: int = 0,
        *,
        host: str | None = None,
        tee: Tee | str = "all",
        tail_lines: int = DEFAULT_TAIL_LINES,
        console_out: TextIO | None = None,
        console_err: TextIO | None = None,
        prefixes: Mapping[int, str] | None = None,
    ) -> None:
        self.attempt = attempt
        self._prefixes = dict(prefixes or {})
        self.host = host if host is not None else socket.gethostname()
        self.tee: Tee = parse_tee(tee) if isinstance(tee, str) else parse_tee(list(tee))
        self.tail_lines = tail_lines
        self.attempt_dir: Path | None = Path(log_dir) / f"attempt_{attempt}" if log_dir is not None else None
        self._console_out = console_out
        self._console_err = console_err
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ranks: dict[int, _RankState] = {}
        self._paths: dict[int, Path] = {}

    # -- paths -----------------------------------------------------------------------------------

    def log_path(self, rank: int) -> Path | None:
        """Return the log file of global ``rank`` in this attempt (``None`` without a log dir).

        ``rank_<R>.log``, or, when a file of an earlier round of this attempt had that name, the
        ``rank_<R>.<k>.log`` it was given (once it is attached).
        """
        if self.attempt_dir is None:
            return None
        return self._paths.get(rank, self.attempt_dir / f"rank_{rank}.log")

    def _create(self, rank: int) -> tuple[Path, IO[bytes]]:
        """Create the log file of ``rank``, private, never through a link and never over an earlier one."""
        assert self.attempt_dir is not None
        private_dir(self.attempt_dir)
        for k in range(_MAX_NAMES):
            path = self.attempt_dir / (f"rank_{rank}.log" if k == 0 else f"rank_{rank}.{k}.log")
            try:
                fd = create_file(path)
            except FileExistsError:
                continue  # a round that ran before with the same restart count: keep its log
            return path, os.fdopen(fd, "wb", buffering=0)
        raise RallypointError(f"{self.attempt_dir} holds {_MAX_NAMES} logs of rank {rank}; remove some of them")

    # -- wiring ----------------------------------------------------------------------------------

    def attach(self, rank: int, stdout: IO[bytes] | int | None, stderr: IO[bytes] | int | None) -> None:
        """Start reading a worker's pipes (file objects or raw descriptors; ``None`` to skip one).

        This object takes ownership of the pipes and closes them at end-of-file. A rank can be
        attached once per :class:`WorkerLogs`.

        Raises:
            RallypointError: the log file cannot be created (the message names it), or what is in
                its way is not this user's (:class:`~rallypoint.agent.log_dir.LogDirError`).
        """
        file: IO[bytes] | None = None
        if self.attempt_dir is not None:
            try:
                path, file = self._create(rank)  # closed by the last reader thread
            except (OSError, RallypointError) as err:
                for stream in (stdout, stderr):  # we own them: do not leak the descriptors
                    with contextlib.suppress(OSError):
                        if isinstance(stream, int):
                            os.close(stream)
                        elif stream is not None:
                            stream.close()
                if isinstance(err, RallypointError):
                    raise
                raise RallypointError(
                    f"cannot write worker log {self.log_path(rank)}: {err.strerror or err}. "
                    "Make the log directory writable or choose another one"
                ) from err
        state = _RankState(rank, file, self.tail_lines)
        with self._lock:
            if rank in self._ranks:
                if file is not None:
                    file.close()
                raise ValueError(f"rank {rank} is already attached to these logs")
            self._ranks[rank] = state
            if file is not None:
                self._paths[rank] = path
        streams = [(s, is_err) for s, is_err in ((stdout, False), (stderr, True)) if s is not None]
        state.open_streams = len(streams)
        if not streams and file is not None:
            file.close()
        for stream, is_err in streams:
            fd = stream if isinstance(stream, int) else stream.fileno()
            owner = None if isinstance(stream, int) else stream
            thread = threading.Thread(
                target=self._pump,
                args=(state, fd, owner, is_err),
                name=f"rallypoint-log-{rank}-{'err' if is_err else 'out'}",
                daemon=True,
            )
            state.threads.append(thread)
            thread.start()

    # -- reading ---------------------------------------------------------------------------------

    def _pump(self, state: _RankState, fd: int, owner: IO[bytes] | None, is_err: bool) -> None:
        show = tee_selects(self.tee, state.rank)
        pending = b""
        try:
            while True:
                try:
                    chunk = os.read(fd, _CHUNK)
                except InterruptedError:  # pragma: no cover - Python retries EINTR itself
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                pending += chunk
                if b"\n" in pending:
                    head, _, pending = pending.rpartition(b"\n")
                    self._emit(state, head + b"\n", is_err, show)
                if len(pending) >= _MAX_PARTIAL:
                    self._emit(state, pending, is_err, show)
                    pending = b""
            if pending:
                self._emit(state, pending, is_err, show)
        finally:
            try:
                if owner is not None:
                    owner.close()
                else:
                    os.close(fd)
            except OSError:
                pass
            with self._cond:
                state.open_streams -= 1
                last = state.open_streams == 0
                self._cond.notify_all()
            if last and state.file is not None:
                with state.file_lock:
                    state.file.close()

    def _emit(self, state: _RankState, data: bytes, is_err: bool, show: bool) -> None:
        if state.file is not None:
            with state.file_lock:
                try:
                    if state.mid_line is not None and state.mid_line != is_err:
                        state.file.write(b"\n")  # never continue the other stream's partial line
                    state.file.write(data)
                    state.mid_line = None if data.endswith(b"\n") else is_err
                except (OSError, ValueError) as err:  # disk full, or closed: keep the console going
                    console.lane(True).notice(
                        f"[rallypoint] cannot write worker log {self.log_path(state.rank)}: {err}\n",
                        self._console_err,
                    )
                    state.file = None
        if not (is_err or show):
            return
        text = data.decode("utf-8", errors="replace")
        lines = text.splitlines()
        if is_err:
            with state.tail_lock:
                state.tail.extend(lines)
        if show:
            prefix = self._prefixes.get(state.rank) or f"[{self.host}:{state.rank}] "
            path = self.log_path(state.rank)
            console.lane(is_err).put(
                "".join(f"{prefix}{line}\n" for line in lines),
                lines=len(lines),
                rank=state.rank,
                where=str(path) if path is not None else "no log file: set agent.log_dir to keep every line",
                target=self._console_err if is_err else self._console_out,
            )

    # -- results ---------------------------------------------------------------------------------

    def stderr_tail(self, rank: int, lines: int | None = None) -> list[str]:
        """Return the last ``lines`` (default: all kept) stderr lines of ``rank``, without newlines.

        Call :meth:`wait_drained` first to be sure the tail includes the worker's last words.
        """
        with self._lock:
            state = self._ranks.get(rank)
        if state is None:
            return []
        with state.tail_lock:
            tail = list(state.tail)
        return tail if lines is None else tail[-lines:] if lines > 0 else []

    def wait_drained(self, rank: int | None = None, timeout: float | None = None) -> bool:
        """Wait until the pipes of ``rank`` (or of every attached rank) reached end-of-file.

        A pipe stays open while any process holds its write end, e.g. a grandchild the worker
        left behind, so pass a ``timeout`` after a worker's exit. Returns whether all drained.
        """

        def drained() -> bool:
            if rank is None:
                return all(s.open_streams == 0 for s in self._ranks.values())
            state = self._ranks.get(rank)
            return state is None or state.open_streams == 0

        with self._cond:
            return self._cond.wait_for(drained, timeout)

    def close(self, timeout: float | None = 5.0) -> bool:
        """Wait up to ``timeout`` for every reader to finish; returns whether all did.

        Readers still blocked (a pipe held open by a stray process) are left running as daemon
        threads; their log files are closed when they finish. Console text still queued is not
        waited for: its writer puts what the agent prints next after it (see
        :mod:`rallypoint.agent.console`), and a console that is not read never holds the agent up.
        """
        return self.wait_drained(None, timeout)
