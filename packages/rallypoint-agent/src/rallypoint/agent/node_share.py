"""One node's share of a round's rank assignment, computed once per round for every node.

The agent gives its rendezvous handler an assignment function (:func:`assign_function`): the
node that completes a round runs the job's rank strategy once over every member and encodes each
node's share (its workers' ranks, the world size, the store of worker rank 0) into that node's
seat (see :mod:`rallypoint.rendezvous.seats`). Every other agent decodes its own share
(:func:`share_of`) from the few hundred bytes it receives, instead of reading the whole roster
and running the strategy itself. A round that brings no share (completed by a node without the
function, or the strategy failed there) is computed locally from the roster, as before; so is
the whole assignment when a report needs another node's ranks (:meth:`NodeShare.whole`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rallypoint.agent.ranks import RankAssignment, RankNode, WorkerRanks, compute_assignment

if TYPE_CHECKING:
    from rallypoint.agent.settings import AgentSettings
    from rallypoint.rendezvous.result import RendezvousResult, WorkerStoreInfo
    from rallypoint.rendezvous.state import NodeInfo

__all__ = ["NodeShare", "assign_function", "encode_shares", "rank_nodes", "share_of"]


def rank_nodes(participants: Sequence[NodeInfo]) -> list[RankNode]:
    """The strategies' view of a round's participants (group-rank order)."""
    return [RankNode.from_participant(p, i) for i, p in enumerate(participants)]


def _whole(settings: AgentSettings, participants: Sequence[NodeInfo]) -> RankAssignment:
    return compute_assignment(
        settings.strategy, rank_nodes(participants), settings.strategy_options, name=settings.strategy_name
    )


@dataclass(frozen=True)
class NodeShare:
    """What one node needs of a round's assignment.

    Attributes:
        node_id: the node.
        workers: its workers' ranks, in local-rank order.
        world_size: the number of workers in the job.
        store: where worker rank 0 serves torch's env:// store.
        compute: computes the whole assignment (read on demand, see :meth:`whole`).
    """

    node_id: str
    workers: tuple[WorkerRanks, ...]
    world_size: int
    store: WorkerStoreInfo
    compute: Callable[[], RankAssignment] = field(compare=False, repr=False)
    _whole: list[RankAssignment] = field(default_factory=list, init=False, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, compare=False, repr=False)

    @classmethod
    def of(cls, assignment: RankAssignment, result: RendezvousResult) -> NodeShare:
        """The share of ``result.node`` in a whole assignment computed locally."""
        return cls(
            result.node.node_id,
            assignment.for_node(result.node.node_id),
            assignment.world_size,
            result.store_on(assignment.workers[0].node_id),
            lambda: assignment,
        )

    def for_node(self, node_id: str) -> tuple[WorkerRanks, ...]:
        """The workers of ``node_id`` in local-rank order (another node's: from :meth:`whole`)."""
        return self.workers if node_id == self.node_id else self.whole().for_node(node_id)

    def whole(self) -> RankAssignment:
        """The whole job's assignment, computed on first use from the round's roster."""
        with self._lock:
            if not self._whole:
                self._whole.append(self.compute())
            return self._whole[0]


def encode_shares(assignment: RankAssignment, participants: Sequence[NodeInfo]) -> list[dict[str, Any]]:
    """Each participant's share of ``assignment`` as JSON (group-rank order)."""
    holder = assignment.workers[0].node_id
    first = next(p for p in participants if p.node_id == holder)
    store = [first.addr, first.master_port if first.master_port is not None else 0]
    out = []
    for p in participants:
        workers = [
            [w.local_rank, w.rank, w.role, w.role_rank, w.role_world_size, w.local_world_size, w.group_rank]
            for w in assignment.by_node.get(p.node_id, ())
        ]
        out.append({"workers": workers, "world": assignment.world_size, "store": store, "nodes": len(participants)})
    return out


def assign_function(settings: AgentSettings) -> Callable[[Sequence[NodeInfo]], list[dict[str, Any]]]:
    """The handler's assignment function: the job's rank strategy over the members, each node's share.

    A strategy that fails raises: the rendezvous then sends no share, and every agent computes
    the assignment itself and reports the error (see :meth:`ElasticAgent._assign_or_abort`).
    """

    def assign(participants: Sequence[NodeInfo]) -> list[dict[str, Any]]:
        return encode_shares(_whole(settings, participants), participants)

    return assign


def _decode(value: Any, result: RendezvousResult) -> tuple[tuple[WorkerRanks, ...], int, tuple[str, int]]:
    me = result.node.node_id
    world, nodes = int(value["world"]), int(value["nodes"])
    addr, port = value["store"]
    workers = tuple(
        WorkerRanks(
            node_id=me,
            local_rank=int(local),
            rank=int(rank),
            world_size=world,
            role=str(role),
            role_rank=int(role_rank),
            role_world_size=int(role_world),
            local_world_size=int(lws),
            group_rank=int(group),
            group_world_size=nodes,
        )
        for local, rank, role, role_rank, role_world, lws, group in value["workers"]
    )
    if nodes != result.num_nodes or len(workers) != result.node.local_world_size:
        raise ValueError(f"a share of {len(workers)} worker(s) in {nodes} node(s)")
    return workers, world, (str(addr), int(port))


def share_of(settings: AgentSettings, result: RendezvousResult) -> NodeShare:
    """The node's share of the round ``result``: the one it received, or computed from the roster.

    Raises:
        RankAssignmentError: the rank strategy failed (only when computed here).
    """
    from rallypoint.rendezvous.result import WorkerStoreInfo

    def compute() -> RankAssignment:
        return _whole(settings, result.participants)

    if isinstance(result.assigned, dict):
        try:
            workers, world, store = _decode(result.assigned, result)
        except (KeyError, TypeError, ValueError):
            pass  # not one this agent can use: compute it
        else:
            return NodeShare(result.node.node_id, workers, world, WorkerStoreInfo(*store), compute)
    return NodeShare.of(compute(), result)
