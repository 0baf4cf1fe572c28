"""The roster: a completed round's membership in one record, read once per process.

When a round completes, the node that completes it writes the members' join records, in
group-rank order, as one record ``roster/<round>/<digest>`` and then compare-and-sets the round
header to "complete" naming only that digest. The header stays small whatever the size of the
job, and each member learns the whole membership (everyone's address, local world size and
labels, which its rank strategy needs) with a single read instead of one record per member.

The write that completes the round carries the roster record too (``inline_roster`` in the
header's JSON, see :data:`rallypoint.rendezvous.round_io.INLINE_ROSTER`): the nodes it wakes
take the membership from their watch's event. The header is then rewritten without it.

The digest is a hash of the record's canonical JSON text, so the record is immutable and
content-addressed: :data:`ROSTERS`, a small per-process cache keyed by the digest, can never
return another round's roster, whatever backend or run it came from. Handlers that share a
process (simulated nodes, tests, hot spares) fetch and parse a roster once between them; the
first asks the backend and the others wait for it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rallypoint.rendezvous.backend import RendezvousBackend
from rallypoint.rendezvous.errors import RendezvousStateError
from rallypoint.rendezvous.keyspace import JoinRecord, Member, NodeInfo, roster_key

__all__ = ["ROSTERS", "Roster", "RosterCache", "encode_roster"]


def _digest(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def encode_roster(round_: int, members: Sequence[JoinRecord]) -> tuple[str, dict[str, Any]]:
    """The roster record of ``round_`` (members in group-rank order) and its digest."""
    value = {"round": round_, "members": [m.to_json() for m in members]}
    return _digest(value), value


@dataclass(frozen=True)
class Roster:
    """A parsed roster record.

    Attributes:
        round: the round it belongs to.
        digest: the digest the header names.
        members: node id and incarnation of each member, in group-rank order.
        nodes: each member's node record, in group-rank order.
        index: ``(node id, incarnation) -> group rank``.
    """

    round: int
    digest: str
    members: tuple[Member, ...]
    nodes: tuple[NodeInfo, ...]
    index: Mapping[tuple[str, str], int]

    @classmethod
    def parse(cls, round_: int, digest: str, value: Any) -> Roster:
        """Check ``value`` against ``digest`` and ``round_`` and parse it.

        Raises:
            RendezvousStateError: the record is malformed, of another round, or does not match
                its digest.
        """
        key = roster_key(round_, digest)
        if not isinstance(value, dict) or value.get("round") != round_ or not isinstance(value.get("members"), list):
            raise RendezvousStateError(f"malformed rendezvous roster {key!r}: {str(value)[:200]!r}")
        if _digest(value) != digest:
            raise RendezvousStateError(f"rendezvous roster {key!r} does not match its digest (rewritten by hand?)")
        records = [JoinRecord.from_json(m) for m in value["members"]]
        members = tuple(Member(r.node.node_id, r.incarnation) for r in records)
        index = {(m.node_id, m.incarnation): rank for rank, m in enumerate(members)}
        if len(index) != len(members):
            raise RendezvousStateError(f"rendezvous roster {key!r} lists a node twice")
        return cls(round_, digest, members, tuple(r.node for r in records), index)


class RosterCache:
    """Parsed rosters by digest (the most recent ``size``), fetched once per process.

    Thread-safe. Concurrent callers asking for the same missing roster make one backend read
    between them.
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._items: OrderedDict[str, Roster] = OrderedDict()
        self._lock = threading.Lock()
        self._fetching: dict[str, threading.Lock] = {}

    def _cached(self, digest: str) -> Roster | None:
        with self._lock:
            hit = self._items.get(digest)
            if hit is not None:
                self._items.move_to_end(digest)
            return hit

    def get(self, backend: RendezvousBackend, round_: int, digest: str) -> Roster | None:
        """The roster of ``round_`` with ``digest``; ``None`` when the backend no longer has it.

        Raises:
            RendezvousStateError: the stored record is malformed or does not match the digest.
        """
        hit = self._cached(digest)
        if hit is not None and hit.round == round_:
            return hit
        with self._lock:
            fetching = self._fetching.setdefault(digest, threading.Lock())
        with fetching:
            hit = self._cached(digest)
            if hit is not None and hit.round == round_:
                return hit
            try:
                entry = backend.get(roster_key(round_, digest))
                if entry is None:
                    return None
                roster = Roster.parse(round_, digest, entry.value)
                self.remember(roster)
                return roster
            finally:
                with self._lock:
                    self._fetching.pop(digest, None)

    def known(self, digest: str) -> bool:
        """Whether the roster with ``digest`` is cached."""
        with self._lock:
            return digest in self._items

    def remember(self, roster: Roster) -> None:
        """Keep ``roster`` (one this process wrote or read): its digest names its content."""
        with self._lock:
            self._items[roster.digest] = roster
            self._items.move_to_end(roster.digest)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """Forget every roster (tests)."""
        with self._lock:
            self._items.clear()


#: The process's roster cache.
ROSTERS = RosterCache()
