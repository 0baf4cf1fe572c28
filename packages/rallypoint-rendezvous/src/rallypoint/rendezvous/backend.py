"""The rendezvous backend protocol: a small key-value space scoped by run id.

A backend only provides primitives; the rendezvous algorithm lives in
:mod:`rallypoint.rendezvous.state` and runs the same on every backend.

Data model
    Keys are ``/``-separated strings of printable ASCII (``round/header``, ``join/3/node-a``).
    Values are JSON values (``dict``, ``list``, ``str``, ``int``, ``float``, ``bool``, ``None``);
    a backend stores them as JSON text and never pickles anything. Each stored value has a
    *version*: an opaque token that changes on every write of that key and is never reused for
    the same key (an integer revision works). Versions are compared only for equality.

Layout used by the handler (per run id)
    ``round/header``: the small round header (round number, complete flag, participant ids,
    closed flag); written by compare-and-set only, a handful of times per round.
    ``round/count/<r>``: how many nodes joined round ``r`` (atomic add).
    ``join/<r>/<node>``: one record per node and round (host, address, local world size, labels).
    ``roster/<r>/<digest>``: the members' records of the completed round ``r``, written once.
    ``hb/<node>``: one heartbeat record per node, rewritten by that node only.
    No single value is rewritten by every heartbeat.

Implementations: :class:`rallypoint.rendezvous.memory.MemoryBackend` (in-process) and the
``rallypoint-file`` plugin. :mod:`rallypoint.rendezvous.testing` is the conformance kit every
backend should pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Entry", "JSONValue", "RendezvousBackend", "Version", "check_key"]

#: A JSON-compatible value.
JSONValue = Any
#: An opaque version token (equality comparison only).
Version = int

_KEY_RE = re.compile(r"^[A-Za-z0-9._~:@+=,-]+(/[A-Za-z0-9._~:@+=,-]+)*/?$")


def check_key(key: str, *, prefix: bool = False) -> str:
    """Validate a key (or, with ``prefix=True``, a key prefix, which may be empty or end in ``/``).

    Raises:
        ValueError: the key is empty, has empty segments or characters outside
            ``A-Z a-z 0-9 . _ ~ : @ + = , -``.
    """
    if prefix and key == "":
        return key
    if (
        not isinstance(key, str)
        or not _KEY_RE.fullmatch(key)
        or (key.endswith("/") and not prefix)
        or any(seg in (".", "..") for seg in key.split("/"))
    ):
        raise ValueError(
            f"invalid rendezvous key {key!r}: use '/'-separated segments of letters, digits and . _ ~ : @ + = , -"
            " (not '.' or '..')"
        )
    return key


@dataclass(frozen=True)
class Entry:
    """A stored value and its version.

    Attributes:
        value: the JSON value.
        version: the version token of this write.
    """

    value: JSONValue
    version: Version


@runtime_checkable
class RendezvousBackend(Protocol):
    """A key-value space scoped by one run id. Every method is thread-safe.

    Methods that wait take a ``timeout`` in seconds; none waits forever.
    """

    #: The run id this space belongs to.
    run_id: str
    #: Whether ``set``/``compare_and_set`` honour ``ttl`` (keys disappear after it).
    supports_ttl: bool

    def get(self, key: str) -> Entry | None:
        """The entry stored under ``key``, or ``None``."""
        ...

    def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
        """Store ``value`` unconditionally; return its new version."""
        ...

    def compare_and_set(
        self, key: str, value: JSONValue, *, version: Version | None, ttl: float | None = None
    ) -> tuple[bool, Entry | None]:
        """Store ``value`` only if the key is at ``version`` (``None``: only if the key is absent).

        Returns:
            ``(True, new entry)`` when written; ``(False, current entry or None)`` otherwise.
        """
        ...

    def add(self, key: str, amount: int = 1) -> int:
        """Atomically add ``amount`` to the integer under ``key`` (absent counts as 0); return the sum."""
        ...

    def delete(self, key: str, *, version: Version | None = None) -> bool:
        """Delete ``key`` (only at ``version`` when given); return whether something was deleted."""
        ...

    def list(self, prefix: str) -> dict[str, Entry]:
        """Every entry whose key starts with ``prefix``."""
        ...

    def watch(self, key: str, *, version: Version | None, timeout: float) -> bool:
        """Block until ``key`` is no longer at ``version`` (``None``: absent) or ``timeout`` passes.

        Returns:
            ``True`` if the key changed (or already differs), ``False`` on timeout.
        """
        ...

    def watch_prefix(self, prefix: str, *, versions: Mapping[str, Version], timeout: float) -> bool:
        """Block until the keys under ``prefix`` change, or ``timeout`` passes.

        ``versions`` is a snapshot from :meth:`list` (key to version); a key added, removed or
        rewritten since then is a change.

        Returns:
            ``True`` on a change, ``False`` on timeout.
        """
        ...

    def close(self) -> None:
        """Release resources (connections, file handles). The stored data stays."""
        ...
