"""The layout of the rendezvous key-value space: its keys and the JSON records stored there.

Every value is JSON (never pickled) and carries only what the protocol in
:mod:`rallypoint.rendezvous.state` needs:

* ``round/header``: the small round header (:class:`Header`), compare-and-set by the nodes (the
  one write that completes a round also carries the round's roster record, see
  :data:`~rallypoint.rendezvous.round_io.INLINE_ROSTER`);
* ``round/count/<r>``: the join counter of round ``r`` (a hint; the records are authoritative);
* ``round/closed``: written just before the header is closed, never removed: a node checking in
  takes no arrival ticket once it exists (see :func:`~rallypoint.rendezvous.backend.check_in`);
* ``join/<r>/<node>``: a node's :class:`JoinRecord` for round ``r`` (its :class:`NodeInfo`);
* ``roster/<r>/<digest>``: the members' join records of the completed round ``r`` in group-rank
  order, in one record written once by the node that completes the round; the header names it
  by the digest of its content (see :mod:`rallypoint.rendezvous.roster`), so every member
  reads the whole membership with one read, and nodes sharing a process read it once;
* ``seat/<node>``: the node's seat in the last round it was placed in (see
  :mod:`rallypoint.rendezvous.seats`): its group rank, the round's size and store, the peers it
  watches and, when the handler was given an assignment function, its own assignment; written by
  the node that completes the round (one request for all of them where the backend can), so that
  each member receives one small record instead of the whole roster;
* ``hb/<node>``: a node's heartbeat record, rewritten every ``heartbeat_interval``;
* ``ticket``: the job-wide arrival counter;
* ``job``: the job's fingerprint (what it runs), written by its first node and compared by
  every node that joins, so that two different jobs given the same run id never merge;
* ``debug/request``: the last request for the workers' stacks (``rallypoint debug stacks``, or an
  agent that saw a hang), watched by every agent (:mod:`rallypoint.agent.debug_service`);
* ``debug/reply/<request>/<node>``: a node's answer to that request (its workers' stacks,
  flight records and process states);
* ``debug/hang/<request>``: the report an agent that saw a hang made of the answers to its
  request (every node writes it next to its ``failure.json``);
* ``debug/hang-claim/<r>``: the node that gathers the hang report of round ``r`` when an agent
  sees no progress (``[debug] hang_timeout``) or a worker's ``CollectiveTimeout`` (the first to
  claim it; it adds the diagnosis line once it has it, for the others).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rallypoint.rendezvous.errors import RendezvousStateError

__all__ = [
    "CLOSED_KEY",
    "DEBUG_REQUEST_KEY",
    "FORMAT",
    "HEADER_KEY",
    "JOB_KEY",
    "ROUND_PREFIX",
    "TICKET_KEY",
    "Header",
    "JoinRecord",
    "Member",
    "NodeInfo",
    "count_key",
    "debug_hang_claim_key",
    "debug_hang_key",
    "debug_reply_key",
    "debug_reply_prefix",
    "heartbeat_key",
    "join_key",
    "join_prefix",
    "roster_key",
    "roster_prefix",
    "seat_key",
]

#: The header format written; headers of format 1 (participants inline, no roster) are read too.
FORMAT = 2
_FORMATS = (1, 2)
HEADER_KEY = "round/header"
#: The closing marker: written before the header is closed (a check-in compares its absence).
CLOSED_KEY = "round/closed"
ROUND_PREFIX = "round/"
TICKET_KEY = "ticket"
JOB_KEY = "job"
#: The last debug request (see the module docstring).
DEBUG_REQUEST_KEY = "debug/request"


def debug_reply_prefix(request_id: str) -> str:
    """Prefix of the nodes' answers to the debug request ``request_id``."""
    return f"debug/reply/{request_id}/"


def debug_hang_key(request_id: str) -> str:
    """Key of the hang report made from the answers to the debug request ``request_id``."""
    return f"debug/hang/{request_id}"


def debug_hang_claim_key(round_: int) -> str:
    """Key of the claim to gather round ``round_``'s hang report (see the module docstring)."""
    return f"debug/hang-claim/{round_}"


def debug_reply_key(request_id: str, node_id: str) -> str:
    """Key of ``node_id``'s answer to the debug request ``request_id``."""
    return f"debug/reply/{request_id}/{node_id}"


def count_key(round_: int) -> str:
    """Key of the join counter of ``round_``."""
    return f"round/count/{round_}"


def join_prefix(round_: int) -> str:
    """Prefix of the join records of ``round_``."""
    return f"join/{round_}/"


def join_key(round_: int, node_id: str) -> str:
    """Key of ``node_id``'s join record in ``round_``."""
    return f"join/{round_}/{node_id}"


def roster_prefix(round_: int) -> str:
    """Prefix of the roster records of ``round_``."""
    return f"roster/{round_}/"


def roster_key(round_: int, digest: str) -> str:
    """Key of the roster record of ``round_`` whose content has ``digest``."""
    return f"roster/{round_}/{digest}"


def seat_key(node_id: str) -> str:
    """Key of ``node_id``'s seat record (see :mod:`rallypoint.rendezvous.seats`)."""
    return f"seat/{node_id}"


def heartbeat_key(node_id: str) -> str:
    """Key of ``node_id``'s heartbeat record."""
    return f"hb/{node_id}"


def _require(cond: bool, what: str, data: Any) -> None:
    if not cond:
        raise RendezvousStateError(f"malformed rendezvous {what}: {data!r}")


@dataclass(frozen=True)
class NodeInfo:
    """What a node tells the others about itself.

    Attributes:
        node_id: identity, unique in the job and stable across restarts of the same node
            (``[A-Za-z0-9._~:@+=,-]``).
        host: host name.
        addr: address other nodes and workers can reach this node at.
        local_world_size: number of workers this node runs.
        labels: free-form string labels (rack, zone, GPU model...), used by rank strategies.
        master_port: a port this node offers for the workers' store (used when it becomes
            group rank 0); ``None`` lets the handler pick one.
        env: environment facts the node shares with the others, e.g. the ranks a scheduler
            gave it (``SLURM_PROCID``...), so that every agent's rank strategy sees them.
        previous_rank: the lowest global rank this node's workers had in the last round it ran,
            or ``None``; rank strategies use it to keep ranks stable across rounds.
    """

    node_id: str
    host: str
    addr: str
    local_world_size: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)
    master_port: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    previous_rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "id": self.node_id,
            "host": self.host,
            "addr": self.addr,
            "lws": self.local_world_size,
            "labels": dict(self.labels),
            "port": self.master_port,
            "env": dict(self.env),
            "prev": self.previous_rank,
        }

    @classmethod
    def from_json(cls, data: Any) -> NodeInfo:
        """Parse the JSON form (raises :class:`RendezvousStateError` when malformed)."""
        _require(isinstance(data, dict) and isinstance(data.get("id"), str), "node record", data)
        try:
            return cls(
                node_id=data["id"],
                host=str(data["host"]),
                addr=str(data["addr"]),
                local_world_size=int(data["lws"]),
                labels={str(k): str(v) for k, v in data["labels"].items()},
                master_port=None if data.get("port") is None else int(data["port"]),
                env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
                previous_rank=None if data.get("prev") is None else int(data["prev"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RendezvousStateError(f"malformed rendezvous node record: {data!r} ({exc})") from exc


@dataclass(frozen=True)
class JoinRecord:
    """A node's record in one round (``join/<r>/<node>``).

    Attributes:
        node: the node's description.
        incarnation: random id of the process incarnation (a node restarted with the same
            ``node_id`` gets a new one).
        ticket: arrival order (a job-wide atomic counter).
        prev_rank: the node's group rank in the round it last completed, to keep ranks stable.
    """

    node: NodeInfo
    incarnation: str
    ticket: int
    prev_rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"node": self.node.to_json(), "inc": self.incarnation, "ticket": self.ticket, "prev": self.prev_rank}

    @classmethod
    def from_json(cls, data: Any) -> JoinRecord:
        """Parse the JSON form."""
        _require(isinstance(data, dict) and "node" in data and isinstance(data.get("inc"), str), "join record", data)
        try:
            return cls(
                NodeInfo.from_json(data["node"]),
                data["inc"],
                int(data["ticket"]),
                None if data.get("prev") is None else int(data["prev"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RendezvousStateError(f"malformed rendezvous join record: {data!r} ({exc})") from exc

    def order(self) -> tuple[int, int, int, str]:
        """Sort key: previous members first in their previous order, then arrival order."""
        prev = -1 if self.prev_rank is None else self.prev_rank
        return (0 if self.prev_rank is not None else 1, prev, self.ticket, self.node.node_id)


@dataclass(frozen=True)
class Member:
    """A participant of a completed round: node id and incarnation."""

    node_id: str
    incarnation: str


@dataclass(frozen=True)
class Header:
    """The small round header (``round/header``).

    Attributes:
        round: the round number, starting at 0.
        complete: whether the round's membership is fixed.
        participants: the members in group-rank order (only when complete).
        closed: the job is over.
        reason: why this round was opened, or why the job was closed (for logs and
            ``rallypoint status``).
        failed: the job was closed because it failed for good (only with ``closed``).
        roster: the digest of the round's roster record (``roster/<round>/<digest>``), which
            holds the participants; empty when they are inline. A header parsed from JSON with a
            roster has no ``participants`` until resolved
            (:func:`rallypoint.rendezvous.round_io.read_header` does it).
        index: ``(node id, incarnation) -> rank`` of ``participants``, when known (a resolved
            roster brings it), so :meth:`rank_of` needs no scan. Not part of equality.
        seats: the node that completed the round wrote a seat record per member
            (``seat/<node>``); a member may resolve the header from its own seat alone.
        size: the number of members of a complete round whose header names a roster (``0``
            when unknown: a header written before seats, whose roster gives it).
        ring: the peers whose heartbeats the resolving node watches, when the header was
            resolved from its seat (``participants`` is then empty); ``None`` otherwise. Not part
            of equality.
    """

    round: int = 0
    complete: bool = False
    participants: tuple[Member, ...] = ()
    closed: bool = False
    reason: str = ""
    failed: bool = False
    roster: str = ""
    index: Mapping[tuple[str, str], int] | None = field(default=None, compare=False, repr=False)
    seats: bool = False
    size: int = 0
    ring: tuple[str, ...] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """JSON form (small: with a roster, the participants stay in the roster record)."""
        inline = () if self.roster else self.participants
        return {
            "format": FORMAT,
            "round": self.round,
            "complete": self.complete,
            "participants": [[m.node_id, m.incarnation] for m in inline],
            "roster": self.roster,
            "closed": self.closed,
            "reason": self.reason,
            "failed": self.failed,
            "seats": self.seats,
            "size": self.size,
        }

    @classmethod
    def from_json(cls, data: Any) -> Header:
        """Parse the JSON form (raises :class:`RendezvousStateError` when malformed or foreign)."""
        _require(isinstance(data, dict) and data.get("format") in _FORMATS, "round header", data)
        try:
            return cls(
                round=int(data["round"]),
                complete=bool(data["complete"]),
                participants=tuple(Member(str(a), str(b)) for a, b in data["participants"]),
                closed=bool(data["closed"]),
                reason=str(data.get("reason", "")),
                failed=bool(data.get("failed", False)),
                roster=str(data.get("roster") or ""),
                seats=bool(data.get("seats", False)),
                size=int(data.get("size", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RendezvousStateError(f"malformed rendezvous round header: {data!r} ({exc})") from exc

    @property
    def num_members(self) -> int:
        """The number of members of a complete round (known without its roster when it has seats)."""
        return len(self.participants) or self.size

    def member_ids(self) -> list[str]:
        """Participant node ids in rank order."""
        return [m.node_id for m in self.participants]

    def rank_of(self, node_id: str, incarnation: str) -> int | None:
        """The group rank of that node incarnation, or ``None``."""
        if self.index is not None:
            return self.index.get((node_id, incarnation))
        for rank, m in enumerate(self.participants):
            if m.node_id == node_id and m.incarnation == incarnation:
                return rank
        return None
