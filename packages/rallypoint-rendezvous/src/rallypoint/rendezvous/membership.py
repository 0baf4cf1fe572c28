"""Who is alive: heartbeat records, liveness from observing them, the watch ring.

Liveness never compares two hosts' clocks: a peer is dead when its heartbeat record has not
changed for ``heartbeat_timeout`` of the observer's own monotonic time. A record that is not a
heartbeat record at all (garbage written by something other than rallypoint, a file that is not
JSON) is not a silent peer: :func:`heartbeat_problem` says what is wrong with it, and the state
machine fails the round at once rather than wait for anyone.

Who waits for a round (scale-up, hot spares) is :mod:`rallypoint.rendezvous.spares`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LivenessTracker",
    "Unreadable",
    "heartbeat_problem",
    "heartbeat_record",
    "ring_successors",
]


@dataclass(frozen=True)
class Unreadable:
    """A heartbeat record the backend could not read (not JSON, not decodable), and why."""

    why: str


def heartbeat_record(incarnation: str, seq: int) -> dict[str, Any]:
    """The heartbeat record a node writes: its incarnation and a counter that changes every beat."""
    return {"inc": incarnation, "seq": seq}


def heartbeat_problem(value: Any) -> str | None:
    """What is wrong with an observed heartbeat record, or ``None`` (well formed, or absent: ``None``).

    >>> heartbeat_problem({"inc": "a1", "seq": 3}) is None, heartbeat_problem("garbage")
    (True, "it holds 'garbage', not a heartbeat record")
    """
    if value is None:
        return None
    if isinstance(value, Unreadable):
        return value.why
    if (
        isinstance(value, dict)
        and isinstance(value.get("inc"), str)
        and isinstance(value.get("seq"), int)
        and not isinstance(value.get("seq"), bool)
    ):
        return None
    shown = repr(value)
    return f"it holds {shown if len(shown) <= 60 else shown[:57] + '...'}, not a heartbeat record"


class LivenessTracker:
    """Decides which peers are dead from observations of their heartbeat records.

    A peer is dead when its heartbeat value has not changed for ``timeout`` seconds of the
    observer's own clock, counted from the first time the observer saw that value. The value's
    content (a counter, an incarnation) is never interpreted as a time.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._seen: dict[str, tuple[Any, float]] = {}

    def observe(self, node_id: str, value: Any, now: float) -> None:
        """Record that ``node_id``'s heartbeat value is ``value`` at ``now``."""
        last = self._seen.get(node_id)
        if last is None or last[0] != value:
            self._seen[node_id] = (value, now)

    def is_dead(self, node_id: str, now: float) -> bool:
        """Whether ``node_id`` has been seen unchanged for the timeout (never observed: alive)."""
        last = self._seen.get(node_id)
        return last is not None and now - last[1] >= self.timeout

    def forget(self, node_id: str) -> None:
        """Drop what is known about ``node_id``."""
        self._seen.pop(node_id, None)

    def clear(self) -> None:
        """Drop every observation (a new rendezvous attempt, or a new round, starts afresh).

        A value observed in an earlier round may be the last beat of a node that was since
        restarted under the same id: the new incarnation's first beat comes one heartbeat
        interval after it starts joining, so judging it by the old value's age would take it
        for dead at once.
        """
        self._seen.clear()


def ring_successors(ids: Sequence[str], me: str, k: int = 2) -> tuple[str, ...]:
    """The (up to) ``k`` nodes after ``me`` in the ring ``ids``; each node watches those."""
    if me not in ids or len(ids) < 2:
        return tuple(i for i in ids[:k] if i != me) if me not in ids else ()
    pos = ids.index(me)
    out: list[str] = []
    for step in range(1, min(k, len(ids) - 1) + 1):
        out.append(ids[(pos + step) % len(ids)])
    return tuple(out)
