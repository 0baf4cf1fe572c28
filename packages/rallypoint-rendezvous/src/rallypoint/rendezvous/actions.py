"""What the state machine reads (:class:`View`), knows (:class:`Settings`) and answers (the actions).

The caller of :meth:`~rallypoint.rendezvous.state.RendezvousStateMachine.step` passes a
:class:`View` of the backend and carries out the returned action: a write
(:class:`WriteJoin`, :class:`CasHeader`, :class:`RemoveJoins`), a read
(:class:`NeedJoins`, :class:`NeedHeartbeats`), a :class:`Wait`, or an outcome
(:class:`Finished`, :class:`Closed`, :class:`TimedOut`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rallypoint.rendezvous.backend import Version
from rallypoint.rendezvous.errors import TimeoutInfo
from rallypoint.rendezvous.keyspace import Header, JoinRecord
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = [
    "Action",
    "CasHeader",
    "Closed",
    "Finished",
    "NeedHeartbeats",
    "NeedJoins",
    "RemoveJoins",
    "Settings",
    "TimedOut",
    "View",
    "Wait",
    "WriteJoin",
]


@dataclass(frozen=True)
class Settings:
    """Size limits and timeouts of the rendezvous."""

    min_nodes: int
    max_nodes: int
    timeouts: RendezvousTimeouts = field(default_factory=RendezvousTimeouts)
    run_id: str = ""

    def __post_init__(self) -> None:
        if self.min_nodes < 1 or self.max_nodes < self.min_nodes:
            raise ValueError(f"need 1 <= min_nodes <= max_nodes, got min={self.min_nodes} max={self.max_nodes}")


@dataclass(frozen=True)
class View:
    """What a node read from the backend for one step.

    Attributes:
        header: the round header (``Header()`` when none exists yet).
        header_version: its version, ``None`` when absent.
        count: the join counter of ``header.round`` (a hint; records are authoritative).
        joins: the join records of ``header.round`` when read (see :class:`NeedJoins`).
        heartbeats: heartbeat values of the requested nodes (``None`` for absent records).
    """

    header: Header
    header_version: Version | None
    count: int = 0
    joins: Mapping[str, JoinRecord] | None = None
    heartbeats: Mapping[str, Any] | None = None


# -- actions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteJoin:
    """Write this node's join record for ``round`` (and count it if it is new)."""

    round: int
    record: JoinRecord


@dataclass(frozen=True)
class CasHeader:
    """Compare-and-set the header from ``expected`` to ``header``; on failure, read again.

    A header that completes a round carries the members' join records in ``roster`` (group-rank
    order): the executor writes them as the round's roster record first, and the header names it.
    """

    expected: Version | None
    header: Header
    roster: tuple[JoinRecord, ...] = ()


@dataclass(frozen=True)
class RemoveJoins:
    """Delete the join records of dead nodes from ``round`` (and uncount them)."""

    round: int
    node_ids: tuple[str, ...]


@dataclass(frozen=True)
class NeedJoins:
    """Read the join records of the header's round and step again."""


@dataclass(frozen=True)
class NeedHeartbeats:
    """Read the heartbeat records of ``node_ids`` and step again."""

    node_ids: tuple[str, ...]


@dataclass(frozen=True)
class Wait:
    """Nothing to do until the round header changes or ``until`` (the caller's clock) passes.

    The caller watches :data:`HEADER_KEY` from the version in the :class:`View` it stepped
    with (so a change made after that read wakes it at once) and steps again on a change or at
    ``until``. Joins of other nodes need not wake a waiter: the joiner that brings the count to
    ``min`` or ``max`` sees it itself (see the module docstring), and ``until`` is never later
    than the next periodic check, which reads the records.
    """

    until: float


@dataclass(frozen=True)
class Finished:
    """The node is a member of the completed round ``header.round`` with group ``rank``."""

    header: Header
    rank: int


@dataclass(frozen=True)
class Closed:
    """The rendezvous is closed."""


@dataclass(frozen=True)
class TimedOut:
    """The join timeout expired."""

    info: TimeoutInfo


Action = WriteJoin | CasHeader | RemoveJoins | NeedJoins | NeedHeartbeats | Wait | Finished | Closed | TimedOut
