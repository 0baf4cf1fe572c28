"""What the rendezvous server's store accepts: its bounds, and the checks a request passes first.

:class:`Limits` keeps the server's memory finite whatever clients send; the checks here refuse a
run id, key, request id or value before the store touches its state, with a :class:`StoreError`
that the service turns into a gRPC status. No gRPC here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rallypoint.rendezvous.backend import check_key as _check_key_syntax

__all__ = ["Limits", "StoreError", "bounded", "check_json", "check_key", "check_space", "shown"]


class StoreError(Exception):
    """A request the store refuses. ``code`` is one of ``invalid``, ``precondition``, ``exhausted``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Limits:
    """Bounds that keep the server's memory finite whatever clients send.

    Attributes:
        max_value_bytes: largest JSON text of one value.
        max_total_bytes: all keys and values of all spaces together.
        max_watches: watches held at once (each holds one stream).
        max_watch_seconds: the longest a single watch call waits (clients re-issue).
        max_ttl_seconds: the longest lease.
        max_key_bytes: the longest key, key prefix or run id (space).
        max_request_id_bytes: the longest request id (kept for replies to retried writes).
    """

    max_value_bytes: int = 1 << 20
    max_total_bytes: int = 512 << 20
    max_watches: int = 100_000
    max_watch_seconds: float = 3600.0
    max_ttl_seconds: float = 365 * 86400.0
    max_key_bytes: int = 4096
    max_request_id_bytes: int = 128


def shown(text: str) -> str:
    """``text`` for a message: quoted, and cut short when long."""
    return repr(text) if len(text) <= 60 else f"{text[:57]!r}... ({len(text)} characters)"


def bounded(text: str, what: str, limit: int) -> str:
    """``text``, refused when longer than ``limit`` characters (``what`` names it in the message)."""
    if len(text) > limit:
        raise StoreError("invalid", f"{what} {shown(text)} is longer than {limit} characters")
    return text


def _no_constant(name: str) -> Any:
    """``json.loads``'s hook for ``NaN``, ``Infinity`` and ``-Infinity``, which JSON does not have."""
    raise ValueError(f"{name} is not JSON")


def check_space(space: str, limit: int = Limits.max_key_bytes) -> str:
    """A space is a run id: one key segment."""
    bounded(space, "run id", limit)
    try:
        _check_key_syntax(space)
    except ValueError:
        raise StoreError("invalid", f"invalid run id {shown(space)}") from None
    if "/" in space:
        raise StoreError("invalid", f"invalid run id {shown(space)}: no '/' allowed")
    return space


def check_key(key: str, *, prefix: bool, limit: int) -> str:
    """``key`` (or a key prefix) if it is valid and at most ``limit`` characters long."""
    bounded(key, "key prefix" if prefix else "key", limit)
    try:
        return _check_key_syntax(key, prefix=prefix)
    except ValueError as exc:
        raise StoreError("invalid", str(exc)) from None


def check_json(key: str, text: str) -> str:
    """``text`` if it is JSON (no ``NaN`` or ``Infinity``); ``key`` names the value in the message."""
    try:
        json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        why = f" ({exc})" if "is not JSON" in str(exc) else ""
        raise StoreError("invalid", f"value of {shown(key)} is not JSON text{why}") from None
    return text
