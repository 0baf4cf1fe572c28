"""The ``memory`` rendezvous backend: an in-process key-value space.

For tests and single-node jobs: every handler in one process that names the same run id (and
namespace) shares one space. Watches are driven by a :class:`threading.Condition`, so a waiter
wakes as soon as a key changes. TTLs run on the process's monotonic clock.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from rallypoint.rendezvous.backend import Entry, JSONValue, Version, WatchedChange, check_key

__all__ = ["MemoryBackend", "MemoryOptions", "create_memory_backend"]


class MemoryOptions(BaseModel):
    """``[rendezvous.options]`` of the ``memory`` backend.

    Attributes:
        namespace: handlers in one process share a space when run id and namespace match.
    """

    model_config = ConfigDict(extra="forbid")

    namespace: str = "default"


class _Space:
    """The shared data of one run id: JSON text, version and expiry per key."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.cond = threading.Condition()
        self.data: dict[str, tuple[str, int, float | None]] = {}
        self.revision = 0
        self.clock = clock

    def expire(self) -> None:
        now = self.clock()
        dead = [k for k, (_, _, exp) in self.data.items() if exp is not None and exp <= now]
        for key in dead:
            del self.data[key]
        if dead:
            self.revision += 1
            self.cond.notify_all()

    def next_expiry(self) -> float | None:
        expiries = [exp for (_, _, exp) in self.data.values() if exp is not None]
        return min(expiries) if expiries else None


_SPACES: dict[tuple[str, str], _Space] = {}
_SPACES_LOCK = threading.Lock()


def _dump(value: JSONValue) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"rendezvous values must be JSON values, got {type(value).__name__}: {exc}") from exc


class MemoryBackend:
    """An in-process :class:`~rallypoint.rendezvous.backend.RendezvousBackend`.

    Args:
        run_id: the run id.
        shared: share the space with other ``MemoryBackend(shared=True)`` objects of the same
            run id and ``namespace`` in this process (default); ``False`` makes a private space.
        namespace: see :class:`MemoryOptions`.
        clock: monotonic clock used for TTLs (tests pass a fake one).
    """

    supports_ttl = True
    #: The state lives in this process only (see :class:`~rallypoint.rendezvous.backend.RendezvousBackend`).
    local_state = True

    def __init__(
        self,
        run_id: str,
        *,
        shared: bool = True,
        namespace: str = "default",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_id = run_id
        if shared:
            with _SPACES_LOCK:
                space = _SPACES.get((namespace, run_id))
                if space is None:
                    space = _SPACES[(namespace, run_id)] = _Space(clock)
        else:
            space = _Space(clock)
        self._space = space

    # -- helpers -------------------------------------------------------------------------
    def _write(self, key: str, text: str, ttl: float | None) -> int:
        sp = self._space
        sp.revision += 1
        expiry = None if ttl is None else sp.clock() + float(ttl)
        sp.data[key] = (text, sp.revision, expiry)
        sp.cond.notify_all()
        return sp.revision

    def _entry(self, key: str) -> Entry | None:
        item = self._space.data.get(key)
        return None if item is None else Entry(json.loads(item[0]), item[1])

    # -- protocol ------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """See :meth:`RendezvousBackend.get`."""
        check_key(key)
        with self._space.cond:
            self._space.expire()
            return self._entry(key)

    def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
        """See :meth:`RendezvousBackend.set`."""
        check_key(key)
        text = _dump(value)
        with self._space.cond:
            return self._write(key, text, ttl)

    def compare_and_set(
        self, key: str, value: JSONValue, *, version: Version | None, ttl: float | None = None
    ) -> tuple[bool, Entry | None]:
        """See :meth:`RendezvousBackend.compare_and_set`."""
        check_key(key)
        text = _dump(value)
        with self._space.cond:
            self._space.expire()
            current = self._space.data.get(key)
            current_version = None if current is None else current[1]
            if current_version != version:
                return False, self._entry(key)
            new_version = self._write(key, text, ttl)
            return True, Entry(json.loads(text), new_version)

    def add(self, key: str, amount: int = 1) -> int:
        """See :meth:`RendezvousBackend.add`."""
        check_key(key)
        with self._space.cond:
            self._space.expire()
            current = self._entry(key)
            base = 0 if current is None else current.value
            if not isinstance(base, int) or isinstance(base, bool):
                raise TypeError(f"rendezvous key {key!r} holds {base!r}, not an integer; cannot add to it")
            total = base + int(amount)
            self._write(key, str(total), None)
            return total

    def delete(self, key: str, *, version: Version | None = None) -> bool:
        """See :meth:`RendezvousBackend.delete`."""
        check_key(key)
        sp = self._space
        with sp.cond:
            sp.expire()
            item = sp.data.get(key)
            if item is None or (version is not None and item[1] != version):
                return False
            del sp.data[key]
            sp.revision += 1
            sp.cond.notify_all()
            return True

    def list(self, prefix: str) -> dict[str, Entry]:
        """See :meth:`RendezvousBackend.list`."""
        check_key(prefix, prefix=True)
        with self._space.cond:
            self._space.expire()
            return {k: Entry(json.loads(t), v) for k, (t, v, _) in self._space.data.items() if k.startswith(prefix)}

    def _wait(self, changed: Callable[[], bool], timeout: float) -> bool:
        sp = self._space
        deadline = time.monotonic() + max(0.0, timeout)
        with sp.cond:
            while True:
                sp.expire()
                if changed():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                expiry = sp.next_expiry()
                if expiry is not None:  # wake for TTL expiry too
                    remaining = min(remaining, max(0.001, expiry - sp.clock()))
                sp.cond.wait(remaining)

    def watch(self, key: str, *, version: Version | None, timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch`."""
        check_key(key)
        data = self._space.data

        def changed() -> bool:
            item = data.get(key)
            return (None if item is None else item[1]) != version

        return self._wait(changed, timeout)

    def watch_prefix(self, prefix: str, *, versions: Mapping[str, Version], timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch_prefix`."""
        check_key(prefix, prefix=True)
        data = self._space.data
        known = dict(versions)

        def changed() -> bool:
            current = {k: v for k, (_, v, _) in data.items() if k.startswith(prefix)}
            return current != known

        return self._wait(changed, timeout)

    def set_many(self, items: Mapping[str, JSONValue]) -> None:
        """See :class:`~rallypoint.rendezvous.backend.SupportsSetMany`: every key under one lock."""
        texts = {check_key(key): _dump(value) for key, value in items.items()}
        with self._space.cond:
            for key, text in texts.items():
                self._write(key, text, None)

    def wait_with(
        self, key: str, *, version: Version | None, timeout: float, also: Sequence[str]
    ) -> WatchedChange | None:
        """See :class:`~rallypoint.rendezvous.backend.SupportsWaitWith`: the change and ``also`` read under one lock."""
        check_key(key)
        for k in also:
            check_key(k)
        data = self._space.data

        def changed() -> bool:
            item = data.get(key)
            return (None if item is None else item[1]) != version

        with self._space.cond:
            if not self._wait(changed, timeout):
                return None
            return WatchedChange(self._entry(key), {k: self._entry(k) for k in also})

    def close(self) -> None:
        """Nothing to release; the shared space stays for other handlers."""

    @staticmethod
    def reset(namespace: str | None = None) -> None:
        """Forget shared spaces (all, or those of ``namespace``). For tests."""
        with _SPACES_LOCK:
            for key in [k for k in _SPACES if namespace is None or k[0] == namespace]:
                del _SPACES[key]


def create_memory_backend(run_id: str, options: Any = None) -> MemoryBackend:
    """Factory of the ``memory`` backend record: ``(run_id, options) -> backend``."""
    if options is None:
        opts = MemoryOptions()
    elif isinstance(options, MemoryOptions):
        opts = options
    else:
        opts = MemoryOptions.model_validate(dict(options))
    return MemoryBackend(run_id, namespace=opts.namespace)
