"""Exceptions raised by a called function travel back as type, message, arguments and traceback.

The caller rebuilds the same exception type when its module is already imported there (a reply
never makes the caller import anything) and the type is an exception class; otherwise it raises
:class:`~rallypoint.rpc.errors.RemoteException`. Either way the exception carries
``remote_worker`` and ``remote_traceback`` and a note with both.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from rallypoint.rpc.errors import RemoteException, SerializationError
from rallypoint.rpc.serialization import Decoder, Encoder

__all__ = ["describe_exception", "rebuild_exception"]

_MAX_TEXT = 64 << 10


def describe_exception(exc: BaseException, worker: str) -> dict[str, Any]:
    """The JSON description of ``exc`` raised on ``worker`` (its arguments only if they are plain data)."""
    args_tree: Any
    enc = Encoder()
    try:
        args_tree = enc.add(list(exc.args))
        if enc.out.buffers or enc.out.rrefs:
            args_tree = None
    except (SerializationError, RecursionError):
        args_tree = None
    tb = "".join(traceback.format_exception(exc))
    return {
        "type": f"{type(exc).__module__}:{type(exc).__qualname__}",
        "msg": str(exc)[:_MAX_TEXT],
        "args": args_tree,
        "tb": tb[-_MAX_TEXT:],
        "worker": worker,
    }


def _local_type(path: str) -> type[BaseException] | None:
    module_name, _, qualname = path.partition(":")
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        if obj is None or not part.isidentifier():
            return None
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return obj
    return None


def rebuild_exception(info: Any, decoder: Decoder) -> BaseException:
    """The exception a remote error description stands for (see the module docstring)."""
    if not isinstance(info, dict):
        return RemoteException("unknown", "malformed error reply", "unknown worker", "")
    path, msg = str(info.get("type", "builtins:Exception")), str(info.get("msg", ""))
    worker, tb = str(info.get("worker", "unknown worker")), str(info.get("tb", ""))
    exc: BaseException | None = None
    cls = _local_type(path)
    if cls is not None:
        try:
            args = decoder.decode(info["args"], []) if info.get("args") is not None else [msg]
            exc = cls(*args) if isinstance(args, list) else cls(msg)
        except Exception:  # noqa: BLE001 - any failure to rebuild falls back to RemoteException
            exc = None
    if exc is None:
        exc = RemoteException(path.replace(":", "."), msg, worker, tb)
    exc.remote_worker = worker  # type: ignore[attr-defined]
    exc.remote_traceback = tb  # type: ignore[attr-defined]
    exc.add_note(f"(raised on RPC worker {worker}; remote traceback follows)\n{tb.rstrip()}")
    return exc
