"""The rendezvous server's persistence (``data_dir``): an append-only log of its writes.

Every write is appended to ``<data_dir>/rendezvous.log`` as one JSON line and flushed, and the
writes of one request (a join's record and its counter) as one line (:meth:`StoreLog.one_line`),
so a crash keeps all of them or none. That survives the server process being killed; ``fsync``
is not called on appends, so a power loss may drop the last writes. On start the store replays
the log (:meth:`StoreLog.replay`), then has it rewritten to the live state
(:meth:`StoreLog.rewrite`). A lease's expiry is kept in wall time, so it keeps counting while the
server is down. No gRPC here, and no locks: the store calls it from the server's event loop.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["LOG_NAME", "LoggedWrite", "StoreLog"]

LOG_NAME = "rendezvous.log"


@dataclass(frozen=True)
class LoggedWrite:
    """One change of a space, as the log holds it.

    Attributes:
        op: ``"put"`` (a value stored), ``"del"`` (a key gone) or ``"rev"`` (the space's revision).
        space: the run id.
        version: the space's revision after the change (the value's version for ``"put"``).
        key: the key (``""`` for ``"rev"``).
        text: the JSON text stored (``"put"`` only).
        expires: when the lease of a ``"put"`` ends, in wall time (``None``: no lease).
    """

    op: str
    space: str
    version: int
    key: str = ""
    text: str = ""
    expires: float | None = None

    def record(self) -> dict[str, Any]:
        """The JSON object of this change in the log."""
        if self.op == "put":
            return {"op": "put", "s": self.space, "k": self.key, "t": self.text, "v": self.version, "x": self.expires}
        if self.op == "del":
            return {"op": "del", "s": self.space, "k": self.key, "v": self.version}
        return {"op": self.op, "s": self.space, "v": self.version}

    @classmethod
    def parse(cls, rec: dict[str, Any]) -> LoggedWrite:
        """The change a JSON object of the log holds.

        Raises:
            KeyError, TypeError, ValueError: not a change this log writes.
        """
        op, space, version = rec["op"], _text(rec["s"]), int(rec["v"])
        if op == "put":
            wall = rec.get("x")
            return cls(op, space, version, _text(rec["k"]), _text(rec["t"]), None if wall is None else float(wall))
        if op == "del":
            return cls(op, space, version, _text(rec["k"]))
        return cls(op, space, version)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, not {value!r}")
    return value


class StoreLog:
    """The log of one server's writes in ``directory`` (created if missing).

    Args:
        directory: the ``data_dir``.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / LOG_NAME
        #: The log open for appending (after :meth:`rewrite`), or ``None``.
        self.file: IO[str] | None = None
        self._grouped: list[LoggedWrite] | None = None

    def replay(self) -> Iterator[LoggedWrite]:
        """The changes of the log, in order, up to the first that cannot be read (a line cut short by a crash)."""
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                    for one in rec["ops"] if rec["op"] == "multi" else [rec]:
                        yield LoggedWrite.parse(one)
                except (ValueError, KeyError, TypeError):
                    # A line cut short by a crash is the last one: everything before it stands.
                    return

    def rewrite(self, changes: Iterable[LoggedWrite]) -> None:
        """Replace the log with ``changes`` (the live state, synced to disk), then open it for appending."""
        tmp = self.path.with_name(f".{LOG_NAME}.tmp")
        with tmp.open("w", encoding="utf-8") as out:
            for change in changes:
                out.write(json.dumps(change.record()) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        self.file = self.path.open("a", encoding="utf-8")

    def append(self, change: LoggedWrite) -> None:
        """Write ``change`` as a line of its own and flush it (inside :meth:`one_line`: hold it for that line)."""
        if self._grouped is not None:
            self._grouped.append(change)
        else:
            self._write(change.record())

    def _write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    @contextlib.contextmanager
    def one_line(self) -> Iterator[None]:
        """The changes appended inside go to the log as one line, written when the block ends (also by an error)."""
        self._grouped = []
        try:
            yield
        finally:
            changes, self._grouped = self._grouped, None
            if len(changes) == 1:
                self._write(changes[0].record())
            elif changes:
                self._write({"op": "multi", "ops": [change.record() for change in changes]})

    def close(self) -> None:
        """Close the log file."""
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None
