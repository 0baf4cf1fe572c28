"""What a member learns of its round: :class:`RendezvousResult` once complete, :class:`RoundStatus` while it runs.

A member learns its own place from its seat (:mod:`rallypoint.rendezvous.seats`): group rank,
size, store, and what the round's assignment function gave it. The whole membership
(:attr:`RendezvousResult.participants`) is read from the round's roster only when asked for, once
per process: a job of thousands of nodes does not make each of them read it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from rallypoint.rendezvous.backend import JSONValue
from rallypoint.rendezvous.keyspace import NodeInfo

__all__ = ["RendezvousResult", "RoundStatus", "WorkerStoreInfo"]


@dataclass(frozen=True)
class WorkerStoreInfo:
    """Where workers find their store (torch ``env://``): a node's address and the port it offers.

    Worker rank 0 serves the store, so the agent uses :meth:`RendezvousResult.store_on` with the
    node that its rank strategy gave global rank 0; :attr:`RendezvousResult.store` is group rank
    0's, right for torch's own agent, which puts global rank 0 on group rank 0.

    Attributes:
        master_addr: value for ``MASTER_ADDR``.
        master_port: value for ``MASTER_PORT``, chosen at run time by that node.
    """

    master_addr: str
    master_port: int


@dataclass(frozen=True)
class RendezvousResult:
    """The outcome of a completed round for one member.

    Attributes:
        run_id: the job's run id.
        round: the round number.
        group_rank: this node's rank among the nodes (0..num_nodes-1).
        num_nodes: the number of nodes in the round.
        store: group rank 0's store address (``MASTER_ADDR``/``MASTER_PORT``); see :meth:`store_on`.
        node: this node's record.
        assigned: what the round's assignment function gave this node (see
            ``RendezvousHandler(assign=...)``), or ``None``: no function, or the node that
            completed the round had none or it failed (compute it from :attr:`participants`).
        roster: the digest of the round's roster (empty for a round without one).

    Examples:
        >>> r = RendezvousResult("job", 0, 0, 1, WorkerStoreInfo("h", 1), NodeInfo("a", "h", "h"),
        ...                      members=lambda: (NodeInfo("a", "h", "h"),))
        >>> [p.node_id for p in r.participants]
        ['a']
    """

    run_id: str
    round: int
    group_rank: int
    num_nodes: int
    store: WorkerStoreInfo
    node: NodeInfo
    assigned: JSONValue = None
    roster: str = ""
    members: Callable[[], tuple[NodeInfo, ...]] = field(default=tuple, compare=False, repr=False)
    _read: list[tuple[NodeInfo, ...]] = field(default_factory=list, init=False, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, compare=False, repr=False)

    @property
    def participants(self) -> tuple[NodeInfo, ...]:
        """Every member's record, in group-rank order: read from the round's roster on first use.

        Raises:
            RendezvousStateError: the roster is gone (the round is long past) or corrupt.
        """
        with self._lock:
            if not self._read:
                self._read.append(tuple(self.members()))
            return self._read[0]

    def store_on(self, node_id: str) -> WorkerStoreInfo:
        """The store address of participant ``node_id``: its address and the port it offered.

        Raises:
            KeyError: ``node_id`` is not a participant of this round.
        """
        if node_id == self.node.node_id:
            found: NodeInfo | None = self.node
        else:
            found = next((p for p in self.participants if p.node_id == node_id), None)
        if found is None:
            raise KeyError(f"node {node_id!r} is not a participant of round {self.round}")
        return WorkerStoreInfo(found.addr, found.master_port if found.master_port is not None else 0)


@dataclass(frozen=True)
class RoundStatus:
    """What a member reads of the rendezvous while its workers run (one read of the header).

    Attributes:
        closed: the job is over.
        failed: it was closed because it failed for good (stop the workers, report the failure).
        reason: why it was closed, or why the current round was opened.
        waiting: nodes waiting for a new round, or at least 1 when the running round is over
            (see :meth:`RendezvousHandler.num_nodes_waiting`).
        superseded: a newer round than the one this node last completed has opened (membership
            changed), read in the same header as ``closed``, so the two never disagree.
    """

    closed: bool
    failed: bool
    reason: str
    waiting: int
    superseded: bool = False
