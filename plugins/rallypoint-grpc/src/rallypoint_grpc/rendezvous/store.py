"""The server's key-value state: spaces of JSON values, versions, leases and waiters.

No gRPC here, and no locks: every method runs on the server's event loop thread (the service in
:mod:`rallypoint_grpc.rendezvous.server` calls them from its coroutines), so each call is atomic.
Waiters are :class:`asyncio.Event` objects indexed by key (and a short list of prefix waiters), so a
write wakes exactly the watches it concerns and nothing polls. Leases (TTLs) run on the server's
clock. What a request may hold is checked first (:mod:`~rallypoint_grpc.rendezvous.limits`); with a
``data_dir`` every change also goes to the log (:mod:`~rallypoint_grpc.rendezvous.store_log`),
replayed when the store starts.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rallypoint_grpc.rendezvous.limits import Limits, StoreError, bounded, check_json, check_key, check_space, shown
from rallypoint_grpc.rendezvous.store_log import LoggedWrite, StoreLog

__all__ = ["Store"]


@dataclass
class _Item:
    text: str
    version: int
    expiry: float | None  # server monotonic time


@dataclass
class _Space:
    name: str
    revision: int = 0
    data: dict[str, _Item] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # the keys of ``data``, sorted: prefix lists bisect it
    key_waiters: dict[str, set[asyncio.Event]] = field(default_factory=dict)
    prefix_waiters: list[tuple[str, asyncio.Event]] = field(default_factory=list)
    leases: list[tuple[float, str, int]] = field(default_factory=list)  # heap of (expiry, key, version)


class Store:
    """Every space of one server.

    Args:
        limits: see :class:`Limits`.
        data_dir: persist to this directory (created if missing); ``None``: memory only.
        clock: the server's monotonic clock (tests pass a fake one).
    """

    def __init__(
        self,
        limits: Limits | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits or Limits()
        self.clock = clock
        self.spaces: dict[str, _Space] = {}
        self.total_bytes = 0
        self.watches = 0
        self._replies: OrderedDict[str, Any] = OrderedDict()
        self._log: StoreLog | None = None
        if data_dir is not None:
            log = StoreLog(Path(data_dir))
            self._load(log)
            self._log = log

    # -- persistence ----------------------------------------------------------------------
    def _load(self, log: StoreLog) -> None:
        """Replay ``log``, drop the leases that ran out meanwhile, and have it rewritten to the live state."""
        now_wall, now = time.time(), self.clock()
        for change in log.replay():
            self._replay_one(change, now_wall, now)
        for sp in self.spaces.values():
            self.expire(sp)
        log.rewrite(self._live())

    def _live(self) -> Iterator[LoggedWrite]:
        for name, sp in self.spaces.items():
            yield LoggedWrite("rev", name, sp.revision)
            for key, item in sp.data.items():
                yield self._put_change(name, key, item)

    def _replay_one(self, change: LoggedWrite, now_wall: float, now: float) -> None:
        sp = self.spaces.get(change.space) or self.spaces.setdefault(change.space, _Space(change.space))
        sp.revision = max(sp.revision, change.version)
        if change.op == "put":
            expiry = None if change.expires is None else now + (change.expires - now_wall)
            self._store(sp, change.key, _Item(change.text, change.version, expiry))
        elif change.op == "del":
            self._drop(sp, change.key)

    def _put_change(self, space: str, key: str, item: _Item) -> LoggedWrite:
        wall = None if item.expiry is None else time.time() + (item.expiry - self.clock())
        return LoggedWrite("put", space, item.version, key, item.text, wall)

    def _append(self, change: LoggedWrite) -> None:
        if self._log is not None:
            self._log.append(change)

    def _one_line(self) -> contextlib.AbstractContextManager[None]:
        """The writes made inside go to the log as one line, written when the block ends (also by an error)."""
        return contextlib.nullcontext() if self._log is None else self._log.one_line()

    def close(self) -> None:
        """Close the log file."""
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- internals ------------------------------------------------------------------------
    def _store(self, sp: _Space, key: str, item: _Item) -> None:
        old = sp.data.get(key)
        if old is not None:
            self.total_bytes -= len(old.text) + len(key)
        else:
            bisect.insort(sp.keys, key)
        sp.data[key] = item
        self.total_bytes += len(item.text) + len(key)
        if item.expiry is not None:
            heapq.heappush(sp.leases, (item.expiry, key, item.version))

    def _drop(self, sp: _Space, key: str) -> None:
        old = sp.data.pop(key, None)
        if old is not None:
            self.total_bytes -= len(old.text) + len(key)
            del sp.keys[bisect.bisect_left(sp.keys, key)]

    def _remove(self, sp: _Space, key: str) -> None:
        """Delete ``key`` from ``sp`` as a change of its own: a new revision, logged, its watches woken."""
        sp.revision += 1
        self._drop(sp, key)
        self._append(LoggedWrite("del", sp.name, sp.revision, key))
        self._wake(sp, key)

    def _under(self, sp: _Space, prefix: str) -> list[str]:
        """The keys of ``sp`` that start with ``prefix``, in order (a bisection, not a scan)."""
        keys = sp.keys
        start = bisect.bisect_left(keys, prefix)
        end = start
        while end < len(keys) and keys[end].startswith(prefix):
            end += 1
        return keys[start:end]

    def _wake(self, sp: _Space, key: str) -> None:
        for event in sp.key_waiters.pop(key, ()):
            event.set()
        if sp.prefix_waiters:
            keep = []
            for prefix, event in sp.prefix_waiters:
                if key.startswith(prefix):
                    event.set()
                else:
                    keep.append((prefix, event))
            sp.prefix_waiters = keep

    def space(self, name: str) -> _Space:
        """The space of run id ``name`` (created on first use), with expired leases removed."""
        sp = self.spaces.get(name)
        if sp is None:
            sp = self.spaces[check_space(name, self.limits.max_key_bytes)] = _Space(name)
        self.expire(sp)
        return sp

    def expire(self, sp: _Space) -> float | None:
        """Drop expired leases of ``sp``; return the next expiry (server clock) or ``None``."""
        now = self.clock()
        while sp.leases and sp.leases[0][0] <= now:
            _, key, version = heapq.heappop(sp.leases)
            item = sp.data.get(key)
            if item is not None and item.version == version:
                self._remove(sp, key)
        return sp.leases[0][0] if sp.leases else None

    def _write(self, name: str, sp: _Space, key: str, text: str, ttl: float | None) -> int:
        if len(text) > self.limits.max_value_bytes:
            raise StoreError(
                "invalid", f"value of {shown(key)} is {len(text)} bytes; the limit is {self.limits.max_value_bytes}"
            )
        old = sp.data.get(key)
        grow = len(text) + len(key) - (0 if old is None else len(old.text) + len(key))
        if self.total_bytes + grow > self.limits.max_total_bytes:
            raise StoreError(
                "exhausted", f"the server holds {self.total_bytes} bytes; the limit is {self.limits.max_total_bytes}"
            )
        expiry = None
        if ttl is not None:
            if not 0 < ttl <= self.limits.max_ttl_seconds:
                raise StoreError("invalid", f"ttl {ttl!r} out of range (0, {self.limits.max_ttl_seconds}]")
            expiry = self.clock() + ttl
        sp.revision += 1
        item = _Item(text, sp.revision, expiry)
        self._store(sp, key, item)
        self._append(self._put_change(name, key, item))
        self._wake(sp, key)
        return sp.revision

    def _sum(self, sp: _Space, key: str, amount: int) -> int:
        """The integer under ``key`` (absent: 0) plus ``amount``, checked; nothing written."""
        item = sp.data.get(key)
        base = 0 if item is None else json.loads(item.text)
        if not isinstance(base, int) or isinstance(base, bool):
            raise StoreError("precondition", f"rendezvous key {key!r} holds {item and item.text!r}, not an integer")
        total = base + amount
        if not -(2**63) <= total < 2**63:
            raise StoreError("invalid", f"adding {amount} to {key!r} overflows a 64-bit integer")
        return total

    def _once(self, request_id: str, compute: Callable[[], Any]) -> Any:
        """Apply a write once per request id: a retried request gets the first reply again."""
        if not request_id:
            return compute()
        bounded(request_id, "request id", self.limits.max_request_id_bytes)
        if request_id in self._replies:
            return self._replies[request_id]
        reply = compute()
        self._replies[request_id] = reply
        if len(self._replies) > 65536:
            self._replies.popitem(last=False)
        return reply

    def _key(self, key: str, *, prefix: bool = False) -> str:
        """``key`` (or a key prefix) if it is valid and within :attr:`Limits.max_key_bytes`."""
        return check_key(key, prefix=prefix, limit=self.limits.max_key_bytes)

    # -- operations -----------------------------------------------------------------------
    def get(self, name: str, key: str) -> tuple[str, int] | None:
        """``(json text, version)`` of ``key``, or ``None``."""
        item = self.space(name).data.get(self._key(key))
        return None if item is None else (item.text, item.version)

    def set(self, name: str, key: str, text: str, ttl: float | None, request_id: str = "") -> int:
        """Store ``text`` under ``key``; return the new version."""
        self._key(key)
        sp = self.space(name)
        return int(self._once(request_id, lambda: self._write(name, sp, key, check_json(key, text), ttl)))

    def compare_and_set(
        self, name: str, key: str, text: str, version: int | None, ttl: float | None, request_id: str = ""
    ) -> tuple[bool, tuple[str, int] | None]:
        """Write only at ``version`` (``None``: absent); ``(written, entry after the call)``."""
        self._key(key)
        sp = self.space(name)
        check_json(key, text)

        def apply() -> tuple[bool, tuple[str, int] | None]:
            item = sp.data.get(key)
            if (None if item is None else item.version) != version:
                return False, None if item is None else (item.text, item.version)
            return True, (text, self._write(name, sp, key, text, ttl))

        result: tuple[bool, tuple[str, int] | None] = self._once(request_id, apply)
        return result

    def add(self, name: str, key: str, amount: int, request_id: str = "") -> int:
        """Add ``amount`` to the integer under ``key`` (absent: 0); return the sum."""
        self._key(key)
        sp = self.space(name)

        def apply() -> int:
            total = self._sum(sp, key, amount)
            self._write(name, sp, key, str(total), None)
            return total

        return int(self._once(request_id, apply))

    def create_and_add(
        self, name: str, key: str, text: str, counter: str, amount: int, request_id: str = ""
    ) -> tuple[bool, tuple[str, int] | None, int]:
        """Create ``key`` (only if absent) and then add ``amount`` to ``counter``, as one step (a node's join).

        Returns ``(True, None, the sum)``, or ``(False, the entry there, 0)`` with nothing written.
        """
        self._key(key)
        self._key(counter)
        sp = self.space(name)
        check_json(key, text)

        def apply() -> tuple[bool, tuple[str, int] | None, int]:
            item = sp.data.get(key)
            if item is not None:
                return False, (item.text, item.version), 0
            total = self._sum(sp, counter, amount)
            with self._one_line():  # the record and its count: both in the log, or neither
                self._write(name, sp, key, text, None)
                try:
                    self._write(name, sp, counter, str(total), None)
                except StoreError:  # over a limit: take the key back, so that neither write happened
                    self._remove(sp, key)
                    raise
            return True, None, total

        result: tuple[bool, tuple[str, int] | None, int] = self._once(request_id, apply)
        return result

    def check_in(
        self,
        name: str,
        prefix: str,
        counter: str,
        unless: str,
        claim: tuple[str, str] | None,
        request_id: str = "",
    ) -> tuple[dict[str, tuple[str, int]], int | None, tuple[str, int] | None]:
        """A node's check-in as one step: the listing, the job's claim and the arrival ticket.

        List ``prefix``; then, unless ``unless`` exists, create the ``claim`` key ``(key, JSON
        text)`` if absent and add 1 to ``counter`` if the key holds exactly that text (or without
        a claim).

        Returns ``(the listing before the writes, the counter after the add or None when nothing
        was added, the claim key's entry after the call or None)``.
        """
        self._key(prefix, prefix=True)
        self._key(counter)
        self._key(unless)
        if claim is not None:
            self._key(claim[0])
            check_json(claim[0], claim[1])
        sp = self.space(name)

        def apply() -> tuple[dict[str, tuple[str, int]], int | None, tuple[str, int] | None]:
            found = {k: (sp.data[k].text, sp.data[k].version) for k in self._under(sp, prefix)}
            claimed = None if claim is None else sp.data.get(claim[0])
            if unless in sp.data or (claim is not None and claimed is not None and claimed.text != claim[1]):
                return found, None, None if claimed is None else (claimed.text, claimed.version)
            total = self._sum(sp, counter, 1)
            with self._one_line():  # the claim and the count: both in the log, or neither
                created = claim is not None and claimed is None
                if claim is not None and created:
                    self._write(name, sp, claim[0], claim[1], None)
                    claimed = sp.data[claim[0]]
                try:
                    self._write(name, sp, counter, str(total), None)
                except StoreError:  # over a limit: take the claim back, so that neither write happened
                    if claim is not None and created:
                        self._remove(sp, claim[0])
                    raise
            return found, total, None if claimed is None else (claimed.text, claimed.version)

        result: tuple[dict[str, tuple[str, int]], int | None, tuple[str, int] | None] = self._once(request_id, apply)
        return result

    def set_many(self, name: str, items: dict[str, str], request_id: str = "") -> int:
        """Store every ``key: JSON text`` (a completed round's roster and seats), logged as one line.

        Every key and value is checked before anything is written. Returns the last version
        written (0 for no items).
        """
        for key, text in items.items():
            self._key(key)
            check_json(key, text)
        sp = self.space(name)

        def apply() -> int:
            version = 0
            with self._one_line():
                for key, text in items.items():
                    version = self._write(name, sp, key, text, None)
            return version

        return int(self._once(request_id, apply))

    def entries(self, name: str, keys: list[str]) -> dict[str, tuple[str, int]]:
        """``key: (text, version)`` of those ``keys`` that exist (a watch's extra keys)."""
        sp = self.space(name)
        out = {}
        for key in keys:
            item = sp.data.get(self._key(key))
            if item is not None:
                out[key] = (item.text, item.version)
        return out

    def delete(self, name: str, key: str, version: int | None, request_id: str = "") -> bool:
        """Delete ``key`` (only at ``version`` when given)."""
        self._key(key)
        sp = self.space(name)

        def apply() -> bool:
            item = sp.data.get(key)
            if item is None or (version is not None and item.version != version):
                return False
            self._remove(sp, key)
            return True

        return bool(self._once(request_id, apply))

    def list(self, name: str, prefix: str) -> dict[str, tuple[str, int]]:
        """Every ``key: (text, version)`` under ``prefix``."""
        self._key(prefix, prefix=True)
        sp = self.space(name)
        return {k: (sp.data[k].text, sp.data[k].version) for k in self._under(sp, prefix)}

    def changed(self, name: str, key: str, prefix: bool, version: int | None, versions: dict[str, int]) -> bool:
        """Whether the state already differs from what the watcher holds."""
        self._key(key, prefix=prefix)
        sp = self.space(name)
        if not prefix:
            item = sp.data.get(key)
            return (None if item is None else item.version) != version
        current = {k: sp.data[k].version for k in self._under(sp, key)}
        return current != versions

    def arm(self, name: str, key: str, prefix: bool) -> asyncio.Event:
        """An event set by the next write, delete or expiry of ``key`` (or under the prefix)."""
        if self.watches >= self.limits.max_watches:
            raise StoreError(
                "exhausted", f"the server holds {self.watches} watches; the limit is {self.limits.max_watches}"
            )
        sp = self.space(name)
        event = asyncio.Event()
        if prefix:
            sp.prefix_waiters.append((key, event))
        else:
            sp.key_waiters.setdefault(key, set()).add(event)
        self.watches += 1
        return event

    def disarm(self, name: str, key: str, prefix: bool, event: asyncio.Event) -> None:
        """Forget a waiter (after it fired or timed out)."""
        self.watches -= 1
        sp = self.spaces.get(name)
        if sp is None:
            return
        if prefix:
            sp.prefix_waiters = [(p, e) for p, e in sp.prefix_waiters if e is not event]
        else:
            waiters = sp.key_waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del sp.key_waiters[key]
