"""Failure records and the job's root-cause report.

Every agent publishes the failures of its own workers to the rendezvous store; whoever reports
the job's failure gathers them from every node, so the report names the first failure across
the whole job, not only this host's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["FailureReport", "WorkerFailure"]


@dataclass(frozen=True)
class WorkerFailure:
    """One worker that ended badly.

    Attributes:
        rank: global rank.
        local_rank: rank on its node.
        host: the node's host name.
        node_id: the node's rendezvous identity.
        attempt: job-wide restart count when it ran.
        pid: its process id.
        exit_code: its exit status, or ``None`` when a signal killed it.
        signal: the signal's name (``"SIGKILL"``) when a signal killed it.
        time: when its exit was seen, seconds since the epoch.
        reason: a short sentence, e.g. ``"exit code 1"``, ``"signal SIGSEGV"`` or
            ``"watchdog timer 'data_load' expired"``.
        exception: ``"<Type>: <message>"`` from its error file, if it wrote one.
        traceback: the Python traceback from its error file, if any.
        stderr_tail: its last stderr lines.
        log_file: its log file, if logs are kept.
    """

    rank: int
    local_rank: int
    host: str
    node_id: str
    attempt: int
    pid: int
    exit_code: int | None
    signal: str | None
    time: float
    reason: str
    exception: str | None = None
    traceback: str | None = None
    stderr_tail: tuple[str, ...] = ()
    log_file: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form (published through the rendezvous store and written to ``failure.json``)."""
        data = asdict(self)
        data["stderr_tail"] = list(self.stderr_tail)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerFailure:
        """Inverse of :meth:`to_json`."""
        data = dict(data)
        data["stderr_tail"] = tuple(data.get("stderr_tail") or ())
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def headline(self) -> str:
        """``rank 3 (local 1) on host-b: exit code 1, attempt 2``."""
        return f"rank {self.rank} (local {self.local_rank}) on {self.host}: {self.reason}, attempt {self.attempt}"


@dataclass
class FailureReport:
    """The job's failures, root cause first.

    Attributes:
        run_id: the job's run id.
        failures: every failure, ordered by time; :attr:`root_cause` is the first of the last
            attempt (earlier attempts were retried).
        restarts: restarts the job used.
        max_restarts: the budget.
        console_not_shown: lines this node's console did not show (it did not keep up, or was
            closed); the log files have them.
    """

    run_id: str
    failures: list[WorkerFailure] = field(default_factory=list)
    restarts: int = 0
    max_restarts: int = 0
    console_not_shown: int = 0

    @classmethod
    def build(
        cls, run_id: str, failures: Iterable[WorkerFailure], *, restarts: int, max_restarts: int
    ) -> FailureReport:
        """Order ``failures`` (last attempt first, then by time) into a report."""
        ordered = sorted(failures, key=lambda f: (-f.attempt, f.time, f.rank))
        return cls(run_id, ordered, restarts, max_restarts)

    @property
    def root_cause(self) -> WorkerFailure | None:
        """The first failure (by time) of the last attempt."""
        return self.failures[0] if self.failures else None

    def format(self, *, tail: int = 20) -> str:
        """The report as text for the console."""
        root = self.root_cause
        lines = [f"job {self.run_id!r} failed after {self.restarts} of {self.max_restarts} restart(s)"]
        if root is None:
            lines.append("no worker failure was recorded (an agent or the rendezvous failed; see the agent log)")
            return "\n".join(lines)
        when = datetime.fromtimestamp(root.time, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
        lines += [
            "",
            "root cause (first failure of the last attempt):",
            f"  {root.headline()}",
            f"  time:  {when}",
        ]
        if root.pid:  # 0: not known (a lost host's workers)
            lines.append(f"  pid:   {root.pid}")
        if root.log_file:
            lines.append(f"  log:   {root.log_file}")
        if root.exception:
            lines.append(f"  error: {root.exception}")
        if root.traceback:
            lines.append("  traceback:")
            lines += ["    " + line for line in root.traceback.rstrip().splitlines()]
        elif root.stderr_tail:
            lines.append(f"  last {min(tail, len(root.stderr_tail))} stderr line(s):")
            lines += ["    " + line for line in root.stderr_tail[-tail:]]
        others = self.failures[1:]
        if others:
            lines += ["", "other failures:"]
            lines += [f"  {f.headline()}" for f in others]
        if self.console_not_shown:
            lines += ["", f"console: {self.console_not_shown} line(s) not shown here; the log files have every line"]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """JSON form of the report."""
        root = self.root_cause
        return {
            "run_id": self.run_id,
            "restarts": self.restarts,
            "max_restarts": self.max_restarts,
            "root_cause": root.to_json() if root else None,
            "failures": [f.to_json() for f in self.failures],
            "console_not_shown": self.console_not_shown,
        }

    def write(self, path: Path) -> Path:
        """Write the JSON report to ``path`` whole or not at all (its directory is created).

        The text goes to a new temporary file next to ``path`` (mode ``0600``, created without
        following a link), is flushed to disk, then renamed over ``path``: a full or failing disk
        leaves the previous file (or none), never a truncated one, and a link at ``path`` is
        replaced, never followed.

        Raises:
            OSError: the directory or the file could not be written (the temporary file is removed).
        """
        text = json.dumps(self.to_json(), indent=2) + "\n"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            with os.fdopen(os.open(tmp, flags, 0o600), "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return path

    def save(self, path: Path) -> str:
        """Write the report to ``path`` if the disk allows; return the line to print after it.

        Never raises for a file-system error: the console report must not depend on the disk.

        Returns:
            ``"full report: <path>"``, or a sentence naming ``path`` and why it could not be written.
        """
        try:
            return f"full report: {self.write(path)}"
        except OSError as exc:
            reason = f"{exc.strerror} ({errno.errorcode.get(exc.errno, '')})" if exc.errno else str(exc)
            return (
                f"the report above could not be written to {path} ({reason}); "
                "free space or fix the log directory (agent.log_dir) to keep it on disk"
            )


def failures_from_store(entries: Sequence[Any]) -> list[WorkerFailure]:
    """Parse failure records read from the store, skipping malformed ones."""
    out = []
    for value in entries:
        try:
            out.append(WorkerFailure.from_json(value))
        except (TypeError, KeyError, ValueError):
            continue
    return out
