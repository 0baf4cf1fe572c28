"""Error files: how a worker tells the agent why it died.

A worker script decorated with :func:`record` (or one that called :func:`install_excepthook`)
writes a JSON error file to the path in ``TORCHELASTIC_ERROR_FILE`` when an exception escapes,
then lets the exception go on, so the process still exits non-zero. The agent reads the file back
with :func:`read_error_file` to put the exception type, message and traceback in the failure report.

The layout is the one torch's elastic agent writes and reads, so files travel both ways (a script
decorated with torch's ``record`` under rallypoint, or with this ``record`` under torchrun)::

    {"message": {"message": "ValueError: bad input",
                 "extraInfo": {"py_callstack": "Traceback (most recent call last): ...",
                               "timestamp": "1700000000"}},
     "rallypoint": {"version": 1, "exception_type": "ValueError", "exception_module": "builtins",
                    "exception_message": "bad input", "rank": 3, "local_rank": 1,
                    "host": "node-2", "pid": 4242, "timestamp": 1700000000.123}}

Torch ignores the ``rallypoint`` key. ``SystemExit`` with code 0 or ``None`` is not an error and
writes nothing. This module never imports torch.
"""

from __future__ import annotations

import errno
import faulthandler
import functools
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

__all__ = [
    "ERROR_FILE_ENV",
    "WorkerError",
    "error_payload",
    "install_excepthook",
    "read_error_file",
    "record",
    "write_error_file",
]

#: Environment variable holding the error file path (torch's name, so torch tools agree).
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
#: Version of the ``rallypoint`` section of the error file.
_FORMAT_VERSION = 1
#: Most bytes read from an error file.
_MAX_READ = 16 << 20

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class WorkerError:
    """What a worker's error file says.

    Attributes:
        path: the file it was read from.
        message: ``"<Type>: <message>"`` as torch writes it, or, when the file could not be
            read, a sentence that names the file and says what is wrong with it.
        exception_type: the exception class name, e.g. ``"ValueError"``; taken from the
            ``rallypoint`` section or, for torch-written files, from the message prefix.
        traceback: the Python traceback text, if the file has one.
        timestamp: when the error was recorded, in seconds since the epoch.
        rank: global rank of the worker, if it was known (``RANK``).
        local_rank: local rank of the worker, if it was known (``LOCAL_RANK``).
        host: host name of the worker, if recorded.
        pid: process id of the worker, if recorded.
        error_code: torch's ``errorCode`` (the exit code a torch agent stamped), if present.
        problem: ``None`` for a well-formed file; otherwise why it could not be read fully
            (the other fields then hold whatever could be recovered).
        raw: the decoded JSON document (empty when it could not be decoded).
    """

    path: Path
    message: str
    exception_type: str | None = None
    traceback: str | None = None
    timestamp: float | None = None
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    error_code: int | None = None
    problem: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _is_error(exc: BaseException) -> bool:
    """Return whether ``exc`` escaping a worker is a failure worth an error file."""
    return not (isinstance(exc, SystemExit) and exc.code in (0, None))


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def error_payload(exc: BaseException, *, timestamp: float | None = None) -> dict[str, Any]:
    """Build the error-file document for ``exc`` (torch layout plus a ``rallypoint`` section).

    Args:
        exc: the exception; its ``__traceback__`` gives the call stack.
        timestamp: seconds since the epoch; now by default.
    """
    ts = time.time() if timestamp is None else timestamp
    exc_type = type(exc)
    text = str(exc)
    message = f"{exc_type.__name__}: {text}" if text else exc_type.__name__
    callstack = "".join(traceback.format_exception(exc_type, exc, exc.__traceback__))
    return {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(ts))},
        },
        "rallypoint": {
            "version": _FORMAT_VERSION,
            "exception_type": exc_type.__qualname__,
            "exception_module": exc_type.__module__,
            "exception_message": text,
            "rank": _env_int("RANK"),
            "local_rank": _env_int("LOCAL_RANK"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "timestamp": ts,
        },
    }


def write_error_file(exc: BaseException, path: str | os.PathLike[str] | None = None) -> Path | None:
    """Write the error file for ``exc``; never raises.

    Args:
        exc: the exception to record.
        path: where to write; by default the path in ``TORCHELASTIC_ERROR_FILE``. An unset or
            empty variable means no error file is wanted (torch sets it empty when logs go to
            ``/dev/null``), and nothing is written.

    Returns:
        The path written, or ``None`` when nothing was written. A failure to write is reported
        on stderr (naming the file) rather than raised, so it never hides ``exc`` itself.
    """
    target = os.environ.get(ERROR_FILE_ENV, "") if path is None else os.fspath(path)
    if not target:
        return None
    dest = Path(target)
    try:
        document = json.dumps(error_payload(exc), indent=2)
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a reader never sees half a file, even if we are killed meanwhile.
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(document)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except Exception as err:  # noqa: BLE001 - reporting must never mask the worker's own error
        print(f"rallypoint: could not write error file {dest}: {err}", file=sys.stderr)
        return None
    return dest


@overload
def record(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def record(fn: None = None, /) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def record(fn: Callable[P, R] | None = None, /) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a worker's entry point so an escaping exception leaves an error file.

    Use as ``@record`` or ``@record()``. When the call raises, the error file is written to
    ``$TORCHELASTIC_ERROR_FILE`` (see :func:`write_error_file`) and the exception is re-raised
    unchanged, so the process still exits non-zero and the traceback still reaches stderr.
    ``SystemExit(0)`` / ``SystemExit(None)`` propagate without a file; a non-zero ``SystemExit``
    and ``KeyboardInterrupt`` are recorded. Also enables :mod:`faulthandler` on stderr (all
    threads), so a hard crash leaves a native trace in the worker's log.
    """

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            _enable_faulthandler()
            try:
                return func(*args, **kwargs)
            except BaseException as exc:
                if _is_error(exc):
                    write_error_file(exc)
                raise

        return wrapper

    return decorate if fn is None else decorate(fn)


def _enable_faulthandler() -> None:
    try:
        if not faulthandler.is_enabled():
            faulthandler.enable(all_threads=True)
    except (AttributeError, ValueError, OSError):  # no usable stderr (e.g. closed, or pythonw)
        pass


_previous_hook: Callable[[type[BaseException], BaseException, TracebackType | None], Any] | None = None


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if exc.__traceback__ is None and tb is not None:
        exc = exc.with_traceback(tb)
    if _is_error(exc):
        write_error_file(exc)
    (_previous_hook or sys.__excepthook__)(exc_type, exc, tb)


def install_excepthook() -> None:
    """Write an error file for any exception that escapes the main thread of this process.

    For scripts that cannot be decorated (no single entry function). Chains to the hook that
    was installed before (the traceback is still printed, and Python exits with status 1).
    Calling it again does nothing. Also enables :mod:`faulthandler` like :func:`record`.
    """
    global _previous_hook
    _enable_faulthandler()
    if sys.excepthook is _excepthook:
        return
    _previous_hook = sys.excepthook
    sys.excepthook = _excepthook


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _opt_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _type_from_message(message: str) -> str | None:
    """Guess the exception type from torch's ``"<Type>: <msg>"`` message."""
    head = message.split(":", 1)[0].strip()
    if head and all(part.isidentifier() for part in head.split(".")):
        return head.rsplit(".", 1)[-1]
    return None


def read_error_file(path: str | os.PathLike[str]) -> WorkerError | None:
    """Read a worker's error file, written by rallypoint or by torch.

    Returns:
        ``None`` when the file does not exist (the worker wrote none: it was killed, or did not
        use :func:`record`). Otherwise a :class:`WorkerError`. A file that cannot be read, is
        empty, is not JSON or lacks the expected fields does not raise: the result then has
        ``problem`` set and a ``message`` that names the file and says what is wrong.
    """
    p = Path(path)

    def broken(problem: str, raw: dict[str, Any] | None = None) -> WorkerError:
        return WorkerError(path=p, message=f"error file {p} {problem}", problem=problem, raw=raw or {})

    try:
        # never through a link: the file is the worker's, in the job's private log directory
        with os.fdopen(os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
            text = f.read(_MAX_READ).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            return broken("is a symbolic link; rallypoint never reads an error file through one")
        return broken(f"could not be read: {err.strerror or err}")
    if not text.strip():
        return broken("is empty (the worker may have been killed while writing it)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        return broken(f"is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})")
    if not isinstance(data, dict) or "message" not in data:
        return broken('has no "message" field; it is not an error file', data if isinstance(data, dict) else None)

    msg_field = data["message"]
    extra: dict[str, Any] = {}
    error_code: int | None = None
    if isinstance(msg_field, str):  # old torch layout: {"message": "<text>"}
        message = msg_field
    elif isinstance(msg_field, dict):
        message = str(msg_field.get("message", ""))
        raw_extra = msg_field.get("extraInfo")
        extra = raw_extra if isinstance(raw_extra, dict) else {}
        error_code = _opt_int(msg_field.get("errorCode"))
    else:
        return broken('has a "message" field of an unexpected type', data)

    rp_raw = data.get("rallypoint")
    rp: dict[str, Any] = rp_raw if isinstance(rp_raw, dict) else {}
    callstack = extra.get("py_callstack")
    exc_type = rp.get("exception_type")
    host = rp.get("host")
    timestamp = _opt_float(rp.get("timestamp"))
    if timestamp is None:
        timestamp = _opt_float(extra.get("timestamp"))
    return WorkerError(
        path=p,
        message=message or f"error file {p} has an empty message",
        exception_type=exc_type if isinstance(exc_type, str) else _type_from_message(message),
        traceback=callstack if isinstance(callstack, str) else None,
        timestamp=timestamp,
        rank=_opt_int(rp.get("rank")),
        local_rank=_opt_int(rp.get("local_rank")),
        host=host if isinstance(host, str) else None,
        pid=_opt_int(rp.get("pid")),
        error_code=error_code,
        raw=data,
    )
