"""Seats: each member's own share of a completed round, one small record per node.

The node that completes a round knows every member (it read the join records). Besides the
roster (the whole membership, :mod:`rallypoint.rendezvous.roster`), it writes one *seat* per
member under ``seat/<node>``: the round and its roster digest, the member's incarnation, group
rank, the round's size and store address, the peers whose heartbeats the member watches, and,
when the handler was given an assignment function (``RendezvousHandler(assign=...)``), what that
function gave this member (an agent's worker ranks). The function runs once per round, on that
node; its results are encoded once.

A member then needs its seat only: a few hundred bytes whatever the size of the job, instead of
the roster (about 200 bytes per member). Who needs the whole membership (``rallypoint status``,
a rank strategy, a lost host's report) reads the roster on demand. A seat is valid only for the
header that names the same round and roster digest, and for the incarnation it names: a stale
seat (another round, a node restarted under the same id, a lost race between two completing
writes) is never taken; the member then reads the roster, as before seats.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rallypoint.rendezvous.backend import JSONValue
from rallypoint.rendezvous.errors import RendezvousStateError
from rallypoint.rendezvous.keyspace import Header, JoinRecord, NodeInfo, seat_key

__all__ = ["Assign", "Seat", "encode_seats"]

log = logging.getLogger("rallypoint.rendezvous")

#: An assignment function: the members' records in group-rank order -> one JSON value per member
#: (same order), run once per round by the node that completes it (see the module docstring).
Assign = Callable[[Sequence[NodeInfo]], Sequence[JSONValue]]


@dataclass(frozen=True)
class Seat:
    """One member's seat record (``seat/<node>``).

    Attributes:
        round: the round it belongs to.
        roster: the digest of that round's roster (the header names the same one).
        incarnation: the member's incarnation.
        rank: the member's group rank.
        size: the number of members.
        store: group rank 0's address and the port it offers (``MASTER_ADDR``, ``MASTER_PORT``).
        ring: the members whose heartbeats this member watches.
        assigned: what the assignment function gave this member, or ``None`` (no function, or it
            failed: the member then computes from the roster).
    """

    round: int
    roster: str
    incarnation: str
    rank: int
    size: int
    store: tuple[str, int]
    ring: tuple[str, ...]
    assigned: JSONValue = None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "round": self.round,
            "roster": self.roster,
            "inc": self.incarnation,
            "rank": self.rank,
            "size": self.size,
            "store": [self.store[0], self.store[1]],
            "ring": list(self.ring),
            "assigned": self.assigned,
        }

    @classmethod
    def from_json(cls, data: Any) -> Seat:
        """Parse the JSON form.

        Raises:
            RendezvousStateError: the record is malformed.
        """
        try:
            if not isinstance(data, dict):
                raise TypeError("not an object")
            addr, port = data["store"]
            return cls(
                round=int(data["round"]),
                roster=str(data["roster"]),
                incarnation=str(data["inc"]),
                rank=int(data["rank"]),
                size=int(data["size"]),
                store=(str(addr), int(port)),
                ring=tuple(str(r) for r in data["ring"]),
                assigned=data.get("assigned"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RendezvousStateError(f"malformed rendezvous seat record: {str(data)[:200]!r} ({exc})") from exc

    def fits(self, header: Header, incarnation: str) -> bool:
        """Whether this seat belongs to ``header``'s round and roster, for ``incarnation``."""
        return (
            header.seats
            and self.round == header.round
            and self.roster == header.roster
            and self.incarnation == incarnation
            and 0 <= self.rank < self.size
        )


def _assigned(assign: Assign | None, members: Sequence[JoinRecord], round_: int) -> Sequence[JSONValue]:
    """The assignment function's results, or ``None`` for everyone when there is none or it failed.

    A function that fails (a rank strategy refusing the members) fails on every node the same way:
    the members then compute from the roster and each reports the error itself.
    """
    none: list[JSONValue] = [None] * len(members)
    if assign is None:
        return none
    try:
        got = list(assign([m.node for m in members]))
    except Exception as exc:  # noqa: BLE001 - every member computes it again and reports it
        log.debug("round %d: the assignment function failed (%s); members compute from the roster", round_, exc)
        return none
    if len(got) != len(members):
        log.warning(
            "round %d: the assignment function gave %d results for %d members; members compute from the roster",
            round_,
            len(got),
            len(members),
        )
        return none
    return got


def _successors(ids: Sequence[str], rank: int, k: int = 2) -> tuple[str, ...]:
    """The ring successors of the member at ``rank`` (:func:`~rallypoint.rendezvous.membership.ring_successors`)."""
    n = len(ids)
    return tuple(ids[(rank + step) % n] for step in range(1, min(k, n - 1) + 1))


def encode_seats(
    round_: int, digest: str, members: Sequence[JoinRecord], assign: Assign | None = None
) -> dict[str, Seat]:
    """Every member's seat of the completed round ``round_`` (members in group-rank order), by key.

    ``assign``: the assignment function, run once here.
    """
    ids = [m.node.node_id for m in members]
    first = members[0].node
    store = (first.addr, first.master_port if first.master_port is not None else 0)
    assigned = _assigned(assign, members, round_)
    return {
        seat_key(m.node.node_id): Seat(
            round=round_,
            roster=digest,
            incarnation=m.incarnation,
            rank=rank,
            size=len(members),
            store=store,
            ring=_successors(ids, rank),
            assigned=assigned[rank],
        )
        for rank, m in enumerate(members)
    }
