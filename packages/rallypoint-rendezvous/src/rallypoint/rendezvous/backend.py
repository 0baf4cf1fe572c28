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

Optional capabilities
    A backend may also offer ``create_and_add`` (:class:`SupportsCreateAndAdd`): create a key
    and add to a counter in one atomic step, which a node's join is (its record, then the
    round's join counter). :func:`create_and_add` uses it where it exists and otherwise does the
    two steps in turn (what every backend did before; the protocol tolerates the gap between
    them). One request instead of two per join on a networked backend (the etcd backend offers it).

    A backend may also hold a watch open (:class:`SupportsHeldWatch`): a watch on a key set up
    *before* the reads and writes it follows, so that when the node then has to wait for the key,
    nothing can have been missed between its last read and the wait, and no read is needed to
    find out; the change it reports carries the key's new entry where the backend has it. The
    handler holds one on the round header from its first read until its first wait (a node's
    join, then its wait for the round), saving one read before the wait and one after it.

    A backend may also check a node in in one step (:class:`SupportsCheckIn`): read the round
    keys and, unless the run is closed (a marker key exists) or belongs to another job (a claim
    key holds another value), take an arrival ticket, all atomically. :func:`check_in` uses it
    where it exists and otherwise reads, claims and adds in turn. A node that is refused takes
    nothing either way. One request instead of two or three per node (the etcd backend offers it).

    A backend may also write many keys in one call (:class:`SupportsSetMany`): the node that
    completes a round writes one small *seat* record per member (see
    :mod:`rallypoint.rendezvous.seats`) and the roster with one request instead of one per node.
    :func:`set_many` uses it where it exists and otherwise writes the keys in turn.

    A backend may also wait for a key and send more keys with the change (:class:`SupportsWaitWith`):
    a member waiting for its round to complete receives the header and its own seat in one
    message. :func:`wait_with` uses it where it exists and otherwise watches, then reads.

Implementations: :class:`rallypoint.rendezvous.memory.MemoryBackend` (in-process) and the
``rallypoint-file`` plugin. :mod:`rallypoint.rendezvous.testing` is the conformance kit every
backend should pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CheckIn",
    "Entry",
    "HeldWatch",
    "JSONValue",
    "RendezvousBackend",
    "SupportsCheckIn",
    "SupportsCreateAndAdd",
    "SupportsHeldWatch",
    "SupportsSetMany",
    "SupportsWaitWith",
    "Version",
    "WatchedChange",
    "check_in",
    "check_in_in_steps",
    "check_key",
    "create_and_add",
    "create_and_add_in_two_steps",
    "set_many",
    "wait_with",
]

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

    Optional attribute (read with ``getattr``): ``local_state = True`` says the run's state lives
    in this process only and ends with it (the ``memory`` backend; an agent that hosts the gRPC
    server without a data directory). Such an agent writes ``status.json`` into its log directory
    for ``rallypoint status`` (:mod:`rallypoint.agent.status_file`).
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


@runtime_checkable
class SupportsCreateAndAdd(Protocol):
    """The optional capability of a backend that joins in one step (see the module docstring)."""

    def create_and_add(
        self, key: str, value: JSONValue, counter: str, amount: int = 1
    ) -> tuple[bool, Entry | None, int]:
        """Create ``key`` with ``value`` if it is absent and, only then, add ``amount`` to ``counter``: atomically.

        Returns:
            ``(True, None, counter value after the add)`` when ``key`` was created, else
            ``(False, the entry that is there, 0)`` (``counter`` untouched).

        Raises:
            TypeError: ``counter`` holds something else than an integer (``key`` is then not
                created either).
        """
        ...


@dataclass(frozen=True)
class WatchedChange:
    """A change a :class:`HeldWatch` saw.

    Attributes:
        entry: the key's entry after the change when the backend knows it, ``None`` when the key
            was deleted or the backend cannot tell (the caller reads the key).
        also: the entries of the keys a :func:`wait_with` asked for, read just after the change
            (``None``: absent); empty for a plain watch.
    """

    entry: Entry | None = None
    also: Mapping[str, Entry | None] = field(default_factory=dict)


@runtime_checkable
class HeldWatch(Protocol):
    """A watch on one key that has been in place since :meth:`SupportsHeldWatch.hold_watch` returned.

    It serves one wait: :meth:`wait` once, then :meth:`close` (closing twice is harmless).
    """

    def remaining(self) -> float:
        """Seconds until the watch's deadline (0 once passed); :meth:`wait` returns by then."""
        ...

    def wait(self, version: Version | None) -> WatchedChange | None:
        """Block until the key changes after ``version`` (``None``: the key was absent) or the deadline passes.

        Changes the caller had already seen (at or before ``version``) are skipped.

        Returns:
            the change, or ``None`` at the deadline.

        Raises:
            RendezvousBackendError: the watch broke (the caller reads the key and watches again).
        """
        ...

    def close(self) -> None:
        """Stop watching."""
        ...


@runtime_checkable
class SupportsHeldWatch(Protocol):
    """The optional capability of a backend that can hold a watch open (see the module docstring)."""

    def hold_watch(self, key: str, *, timeout: float) -> HeldWatch:
        """Start watching ``key`` now; return once the watch is in place.

        Every change of ``key`` from then on is seen by the returned watch's
        :meth:`~HeldWatch.wait`, for ``timeout`` seconds. For keys written by ``set``,
        ``compare_and_set`` and ``delete`` (not ``add``).

        Raises:
            RendezvousBackendError: the watch could not be set up.
        """
        ...


def create_and_add(
    backend: RendezvousBackend, key: str, value: JSONValue, counter: str, amount: int = 1
) -> tuple[bool, Entry | None, int]:
    """:meth:`SupportsCreateAndAdd.create_and_add` where ``backend`` offers it, else a compare-and-set and an add."""
    if isinstance(backend, SupportsCreateAndAdd):
        return backend.create_and_add(key, value, counter, amount)
    return create_and_add_in_two_steps(backend, key, value, counter, amount)


def create_and_add_in_two_steps(
    backend: RendezvousBackend, key: str, value: JSONValue, counter: str, amount: int = 1
) -> tuple[bool, Entry | None, int]:
    """:func:`create_and_add` as a compare-and-set and then an add (for a backend that cannot fuse them).

    The key is taken back when the add refuses the counter (not an integer), as the one-step form
    never writes it.
    """
    written, current = backend.compare_and_set(key, value, version=None)
    if not written:
        return False, current, 0
    try:
        return True, None, backend.add(counter, amount)
    except TypeError:  # the counter is no integer: take the key back, as the one-step form never wrote it
        created = backend.get(key)
        if created is not None:
            backend.delete(key, version=created.version)
        raise


@dataclass(frozen=True)
class CheckIn:
    """What a node's check-in saw and did (see :func:`check_in`).

    Attributes:
        entries: every entry under the prefix read, as :meth:`RendezvousBackend.list` gives them.
        count: the counter after this node's add; ``None`` when nothing was added (the marker key
            exists, or the claim key holds another value).
        claimed: the claim key's entry after the check-in (``None`` without a claim, or when it
            is absent because the marker stopped its creation).
    """

    entries: dict[str, Entry]
    count: int | None
    claimed: Entry | None = None


@runtime_checkable
class SupportsCheckIn(Protocol):
    """The optional capability of a backend that checks a node in with one request (see the module docstring)."""

    def check_in(
        self, prefix: str, counter: str, *, unless: str, claim: tuple[str, JSONValue] | None = None
    ) -> CheckIn:
        """List ``prefix``, claim a key and add 1 to ``counter``, atomically.

        The ``claim`` key is created with its value if it is absent. The claim and the add
        happen only while ``unless`` is absent, and the add only when the claim key holds the
        claim's value (created now or before; a backend may compare the stored form, and then
        adds nothing for a value written otherwise: the caller adds later).

        Raises:
            TypeError: ``counter`` holds something else than an integer.
        """
        ...


def check_in(
    backend: RendezvousBackend, prefix: str, counter: str, *, unless: str, claim: tuple[str, JSONValue] | None = None
) -> CheckIn:
    """:meth:`SupportsCheckIn.check_in` where ``backend`` offers it, else :func:`check_in_in_steps`."""
    if isinstance(backend, SupportsCheckIn):
        return backend.check_in(prefix, counter, unless=unless, claim=claim)
    return check_in_in_steps(backend, prefix, counter, unless=unless, claim=claim)


def check_in_in_steps(
    backend: RendezvousBackend, prefix: str, counter: str, *, unless: str, claim: tuple[str, JSONValue] | None = None
) -> CheckIn:
    """:func:`check_in` as a list, a compare-and-set of the claim and an add (for a backend that cannot fuse them).

    The marker is looked up in the listing when it lies under ``prefix``, else read. What another
    node writes between the steps is seen by the next read, as with every other request.
    """
    entries = backend.list(prefix)
    marker = entries.get(unless) if unless.startswith(prefix) else backend.get(unless)
    if marker is not None:
        return CheckIn(entries, None, None if claim is None else backend.get(claim[0]))
    claimed = None
    if claim is not None:
        written, claimed = backend.compare_and_set(claim[0], claim[1], version=None)
        if not written and (claimed is None or claimed.value != claim[1]):
            return CheckIn(entries, None, claimed)
    return CheckIn(entries, backend.add(counter, 1), claimed)


@runtime_checkable
class SupportsSetMany(Protocol):
    """The optional capability of a backend that writes many keys in one request (see the module docstring)."""

    def set_many(self, items: Mapping[str, JSONValue]) -> None:
        """Store every ``key: value`` of ``items`` unconditionally, as :meth:`RendezvousBackend.set` would.

        A reader may see some of the keys written before the others (no atomicity is promised);
        the protocol writes the keys it needs before the compare-and-set that publishes them.

        Raises:
            TypeError: a value is not a JSON value (nothing is written).
            ValueError: a key is invalid (nothing is written).
        """
        ...


def set_many(backend: RendezvousBackend, items: Mapping[str, JSONValue]) -> None:
    """:meth:`SupportsSetMany.set_many` where ``backend`` offers it, else one :meth:`~RendezvousBackend.set` per key."""
    if not items:
        return
    if isinstance(backend, SupportsSetMany):
        backend.set_many(items)
        return
    for key in items:
        check_key(key)
    for key, value in items.items():
        backend.set(key, value)


@runtime_checkable
class SupportsWaitWith(Protocol):
    """The optional capability of a backend that sends more keys with a watched change (see the module docstring)."""

    def wait_with(
        self, key: str, *, version: Version | None, timeout: float, also: Sequence[str]
    ) -> WatchedChange | None:
        """Block as :meth:`RendezvousBackend.watch` does; the change comes with ``key``'s entry and those of ``also``.

        Returns:
            ``None`` on timeout, else the change: :attr:`WatchedChange.entry` is ``key``'s entry
            after it (``None`` when deleted) and :attr:`WatchedChange.also` holds each key of
            ``also`` (``None`` when absent), read in the same step as ``key``.
        """
        ...


def wait_with(
    backend: RendezvousBackend, key: str, *, version: Version | None, timeout: float, also: Sequence[str]
) -> WatchedChange | None:
    """:meth:`SupportsWaitWith.wait_with` where ``backend`` offers it, else a watch and then reads."""
    if isinstance(backend, SupportsWaitWith):
        return backend.wait_with(key, version=version, timeout=timeout, also=also)
    if not backend.watch(key, version=version, timeout=timeout):
        return None
    return WatchedChange(backend.get(key), {k: backend.get(k) for k in also})
