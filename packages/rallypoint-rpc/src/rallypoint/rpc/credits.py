"""Giving back the credits of RRefs this worker no longer holds.

Each local RRef object carries one credit of its owner's reference count
(:class:`~rallypoint.rpc.refs.HolderTable`); when the last object of an id is collected, the
credits go back to the owner in a ``decref`` message. A :class:`CreditReturn` does that for one
agent: the garbage collector's finalizers only queue the id (:meth:`CreditReturn.collected`), and
the return's own thread gathers what is collected within :data:`GIVE_BACK_GATHER` seconds into
one message per owner.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from rallypoint.rpc.refs import HolderTable, OwnerTable

__all__ = ["GIVE_BACK_GATHER", "CreditReturn"]

#: Seconds the agent's thread gathers collected RRefs before it gives their credits back (one
#: message per owner for all of them).
GIVE_BACK_GATHER = 0.005
log = logging.getLogger("rallypoint.rpc")


class CreditReturn:
    """The RRefs one worker holds, and the thread that gives back the credits of collected ones.

    Args:
        name: the worker's name (credits of RRefs it owns itself are counted down locally).
        owned: the worker's own RRefs.
        send_decref: ``send_decref(owner, header, what)`` sends a ``decref`` message to ``owner``
            without waiting for its answer (and does nothing once the worker is shut down).
    """

    def __init__(self, name: str, owned: OwnerTable, send_decref: Callable[[str, dict[str, Any], str], None]) -> None:
        self.name = name
        self.owned = owned
        self.held = HolderTable(self.give_back)
        self._send_decref = send_decref
        #: RRef ids whose local objects were collected, for the thread that gives their credits back.
        self._collected: queue.SimpleQueue[str | threading.Event | None] = queue.SimpleQueue()
        self._gathering = threading.local()  # .refs: the credits the collected thread is gathering
        threading.Thread(target=self._give_back_collected, name=f"rpc-{name}-collected", daemon=True).start()

    def collected(self, rref_id: str) -> None:
        """A local RRef object of ``rref_id`` was collected (its finalizer; safe wherever it runs).

        The garbage collector runs finalizers in whatever thread allocates, at any point, also
        while that thread holds a lock of the transport (in the middle of a send). So nothing
        happens here but a put on a queue (:class:`queue.SimpleQueue` is safe to reenter); the
        return's own thread gives the credits back.
        """
        self._collected.put(rref_id)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the credits of every RRef collected so far were given back (sent, not answered)."""
        done = threading.Event()
        self._collected.put(done)
        return done.wait(timeout)

    def give_back(self, owner: str, rref_id: str, credits: int) -> None:
        """Give ``credits`` of ``rref_id`` back to ``owner`` (the holder table's callback).

        In the return's own thread, the credits join the others of its batch; elsewhere they
        are sent at once.
        """
        if owner == self.name:
            self.owned.decref(rref_id, credits)
            return
        gathered: dict[str, dict[str, int]] | None = getattr(self._gathering, "refs", None)
        if gathered is not None:  # the collected thread: sent with the others of its batch
            refs = gathered.setdefault(owner, {})
            refs[rref_id] = refs.get(rref_id, 0) + credits
            return
        self._send_decref(owner, {"op": "decref", "rref": rref_id, "n": credits}, f"RRef {rref_id} (decref)")

    def close(self) -> None:
        """Stop the thread (after what is queued) and forget every RRef held."""
        self._collected.put(None)
        self.held.clear()

    def _give_back_collected(self) -> None:
        """The thread that gives back the credits of collected RRefs.

        It gathers what is collected within :data:`GIVE_BACK_GATHER` seconds of the first and
        gives the credits back with one message per owner: a loop that makes and drops RRefs
        (``remote(...).to_here()``) sends one message for several of them, not one each.
        """
        while True:
            batch = self._next_batch()
            gathered: dict[str, dict[str, int]] = {}
            self._gathering.refs = gathered
            try:
                for item in batch:
                    if isinstance(item, str):
                        try:
                            self.held.release(item)
                        except Exception as exc:  # noqa: BLE001 - this thread must go on; the owner frees it at shutdown
                            log.debug("%s: giving back the credits of RRef %s failed: %s", self.name, item, exc)
            finally:
                self._gathering.refs = None
            for owner, refs in gathered.items():
                self._send_decref(owner, {"op": "decref", "refs": refs}, f"{len(refs)} RRef(s) (decref)")
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()
            if None in batch:
                return

    def _next_batch(self) -> list[str | threading.Event | None]:
        """What is queued within :data:`GIVE_BACK_GATHER` seconds of the next item (waits for it)."""
        batch = [self._collected.get()]
        deadline = time.monotonic() + GIVE_BACK_GATHER
        while isinstance(batch[-1], str) and (left := deadline - time.monotonic()) > 0:
            try:
                batch.append(self._collected.get(timeout=left))
            except queue.Empty:
                break
        return batch
