"""Reference counting of RRefs across workers: the owner's table and each holder's credits.

The rule is additive and needs no confirmations: every time an RRef is *sent* to a worker, its
owner's count goes up by one for that transfer *before* the message leaves (a local increment
when the sender is the owner, a synchronous ``incref`` to the owner otherwise). The receiver
adds one credit per RRef it decodes. When the last local RRef object of an id is collected, the
holder gives all its credits back with one ``decref``. The owner drops the value when its count
reaches zero. Since a sender holds its own RRef (and so its own credit) while it sends, the
count can never reach zero while a transfer is in flight, whatever the order of arrival.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rallypoint.rpc.futures import Future

__all__ = ["HolderTable", "OwnedValue", "OwnerTable"]


@dataclass
class OwnedValue:
    """A value this worker owns: ready once created, kept while ``count`` > 0."""

    count: int = 0
    ready: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


class OwnerTable:
    """The values this worker owns, by RRef id."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._values: dict[str, OwnedValue] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def ids(self) -> list[str]:
        """The ids of the values kept now."""
        with self._lock:
            return list(self._values)

    def incref(self, rref_id: str, n: int = 1) -> None:
        """Count ``n`` more references (the entry exists before its value when increfs come first)."""
        with self._lock:
            self._values.setdefault(rref_id, OwnedValue()).count += n

    def decref(self, rref_id: str, n: int) -> None:
        """Give back ``n`` references; drops the value at zero once it is ready."""
        with self._lock:
            entry = self._values.get(rref_id)
            if entry is None:
                return
            entry.count -= n
            if entry.count <= 0 and entry.ready.is_set():
                del self._values[rref_id]

    def set(self, rref_id: str, value: Any = None, error: BaseException | None = None) -> None:
        """Store the created value (or the error that creating it raised)."""
        with self._lock:
            entry = self._values.setdefault(rref_id, OwnedValue())
            entry.value, entry.error = value, error
            entry.ready.set()
            if entry.count <= 0:
                del self._values[rref_id]

    def get(self, rref_id: str, timeout: float | None, *, expected: bool = False) -> OwnedValue | None:
        """The entry once its value is ready; ``None`` if unknown (deleted or never created).

        Args:
            rref_id: the RRef's id.
            timeout: seconds to wait for a value being created (``None``: no limit).
            expected: the caller knows the value is being created (its creation request may
                still be on its way): wait for it to arrive instead of answering ``None``.

        Raises:
            TimeoutError: the value is still being created after ``timeout`` seconds.
        """
        with self._lock:
            entry = self._values.get(rref_id)
            if entry is None and expected:
                entry = self._values[rref_id] = OwnedValue()
        if entry is None:
            return None
        if not entry.ready.wait(timeout):
            with self._lock:
                if not entry.ready.is_set() and entry.count <= 0 and self._values.get(rref_id) is entry:
                    del self._values[rref_id]
            raise TimeoutError(f"RRef {rref_id} is still being created after {timeout:g}s")
        return entry

    def clear(self) -> None:
        """Forget everything (shutdown)."""
        with self._lock:
            self._values.clear()


@dataclass
class _Held:
    owner: str
    credits: int = 0
    live: int = 0
    creation: Future[Any] | None = None


class HolderTable:
    """The RRefs this worker holds, with the credits it owes each owner.

    Args:
        give_back: ``give_back(owner, rref_id, credits)``, called (outside the lock) when the last
            local RRef object of an id is gone.
    """

    def __init__(self, give_back: Callable[[str, str, int], None]) -> None:
        self._lock = threading.RLock()
        self._held: dict[str, _Held] = {}
        self._give_back = give_back

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def adopt(self, rref_id: str, owner: str, creation: Future[Any] | None = None) -> None:
        """One more local RRef object for ``rref_id``, carrying one credit."""
        with self._lock:
            held = self._held.setdefault(rref_id, _Held(owner))
            held.credits += 1
            held.live += 1
            if creation is not None:
                held.creation = creation

    def release(self, rref_id: str) -> None:
        """A local RRef object of ``rref_id`` was collected."""
        with self._lock:
            held = self._held.get(rref_id)
            if held is None:
                return
            held.live -= 1
            if held.live > 0:
                return
            del self._held[rref_id]
        creation = held.creation
        if creation is not None and not creation.done():
            # the owner counts the creator's reference when it creates the value: give it back after
            creation.add_done_callback(lambda _: self._give_back(held.owner, rref_id, held.credits))
        else:
            self._give_back(held.owner, rref_id, held.credits)

    def clear(self) -> None:
        """Forget everything (shutdown: the owners are going away too)."""
        with self._lock:
            self._held.clear()
