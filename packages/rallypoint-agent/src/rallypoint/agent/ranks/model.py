"""The rank records: what a strategy reads (:class:`RankNode`) and what it returns.

A strategy reads one :class:`RankNode` per rendezvous participant and returns a
:class:`RankAssignment`: one :class:`WorkerRanks` per worker of the job. A strategy that cannot
assign ranks, or whose result is invalid, is a :class:`RankAssignmentError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from rallypoint.core.errors import RallypointError

if TYPE_CHECKING:
    from rallypoint.rendezvous.state import NodeInfo

__all__ = ["DEFAULT_ROLE", "RankAssignment", "RankAssignmentError", "RankNode", "WorkerRanks"]

#: The role of a node that does not name one (torchrun's ``--role`` default).
DEFAULT_ROLE = "default"


def is_int(value: object) -> bool:
    """Whether ``value`` is an int and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


class RankAssignmentError(RallypointError):
    """A rank strategy produced an invalid assignment (or could not produce one).

    ``str(error)`` names the strategy, the offending node or rank, and what is wrong.

    Attributes:
        strategy: the strategy's name.
        detail: what is wrong, without the strategy prefix.
    """

    def __init__(self, strategy: str, detail: str, *, raised: bool = False) -> None:
        self.strategy = strategy
        self.detail = detail
        what = "failed" if raised else "produced an invalid assignment"
        super().__init__(f"rank strategy {strategy!r} {what}: {detail}")


@dataclass(frozen=True, kw_only=True)
class RankNode:
    """One rendezvous participant (node), as rank strategies see it after a round.

    The agent builds one per participant of the round from the participant's rendezvous record
    (:class:`rallypoint.rendezvous.state.NodeInfo`), adding the ``group_rank`` and ``role`` the
    rendezvous does not carry. Every agent builds the same ones.

    Attributes:
        node_id: the participant's unique id in the round.
        group_rank: the node's rank from the rendezvous, ``0..G-1`` over the ``G`` nodes.
        host: the node's host name (for messages and host-based strategies).
        local_world_size: how many workers the node runs (``--nproc-per-node``), at least 1.
        role: the role of the node's workers (torchrun ``--role``).
        labels: free-form labels the node published (rack, switch, GPU model...). The agent
            fills them with :func:`rallypoint.agent.node.read_node_labels`: the node's labels file (if one is
            configured) merged with its ``RALLYPOINT_NODE_LABELS`` variable (which wins).
        env: environment variables a strategy may read (e.g. those a scheduler such as Slurm
            set); empty unless the node published them. The agent publishes the node's
            ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and every
            ``SLURM_*`` and ``OMPI_COMM_WORLD_*`` variable that is set.
        previous_rank: for stable re-rendezvous: the lowest global rank this node's workers had
            in the assignment of the previous round of the same run, as this node itself
            remembers it; ``None`` (the default) when the node did not take part in the
            immediately preceding round (a new node, the first round, or the node missed a
            round), or when the node's previous assignment is unknown. Each agent publishes its
            own value in its rendezvous record, so every agent sees the same values. Strategies
            that keep ranks stable (``topology``) use it only to order survivors and spot holes;
            a stale or inconsistent value never makes an assignment invalid, only less stable.

    Examples:
        >>> RankNode(node_id="n0", group_rank=0, host="gpu-0", local_world_size=8).role
        'default'
    """

    node_id: str
    group_rank: int
    host: str
    local_world_size: int
    role: str = DEFAULT_ROLE
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    env: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)
    previous_rank: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not self.node_id:
            raise ValueError(f"RankNode.node_id must be a non-empty string, got {self.node_id!r}")
        if not is_int(self.group_rank) or self.group_rank < 0:
            raise ValueError(f"node {self.node_id!r}: group_rank must be an int >= 0, got {self.group_rank!r}")
        if not is_int(self.local_world_size) or self.local_world_size < 1:
            raise ValueError(
                f"node {self.node_id!r}: local_world_size must be an int >= 1, got {self.local_world_size!r}"
            )
        if not isinstance(self.role, str) or not self.role:
            raise ValueError(f"node {self.node_id!r}: role must be a non-empty string, got {self.role!r}")
        if self.previous_rank is not None and (not is_int(self.previous_rank) or self.previous_rank < 0):
            raise ValueError(
                f"node {self.node_id!r}: previous_rank must be None or an int >= 0, got {self.previous_rank!r}"
            )
        # Frozen means frozen: callers cannot change the mappings behind the strategy's back.
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    @classmethod
    def from_participant(cls, participant: NodeInfo, group_rank: int, *, role: str = DEFAULT_ROLE) -> RankNode:
        """The strategies' view of one rendezvous participant.

        Args:
            participant: the node's rendezvous record (what the node published).
            group_rank: the node's position among the round's participants.
            role: its workers' role.

        Examples:
            >>> from rallypoint.rendezvous.state import NodeInfo
            >>> record = NodeInfo(node_id="n1", host="gpu-1", addr="10.0.0.1", local_world_size=4,
            ...                   labels={"rack": "r1"}, previous_rank=8)
            >>> node = RankNode.from_participant(record, 1)
            >>> node.group_rank, node.role, dict(node.labels), node.previous_rank
            (1, 'default', {'rack': 'r1'}, 8)
        """
        return cls(
            node_id=participant.node_id,
            group_rank=group_rank,
            host=participant.host,
            local_world_size=participant.local_world_size,
            role=role,
            labels=participant.labels,
            env=participant.env,
            previous_rank=participant.previous_rank,
        )


@dataclass(frozen=True, kw_only=True)
class WorkerRanks:
    """The ranks of one worker process.

    Attributes:
        node_id: the node that runs the worker.
        local_rank: the worker's index on its node, ``0..local_world_size-1`` (``LOCAL_RANK``).
        rank: the global rank, ``0..world_size-1`` (``RANK``).
        world_size: number of workers in the job (``WORLD_SIZE``).
        role: the worker's role (``ROLE_NAME``).
        role_rank: the rank among the workers of the same role (``ROLE_RANK``).
        role_world_size: number of workers with that role (``ROLE_WORLD_SIZE``).
        local_world_size: number of workers on the node (``LOCAL_WORLD_SIZE``).
        group_rank: the node's rank (``GROUP_RANK``).
        group_world_size: number of nodes (``GROUP_WORLD_SIZE``).

    Examples:
        >>> w = WorkerRanks(node_id="n1", local_rank=1, rank=5, world_size=8, role="default",
        ...                 role_rank=5, role_world_size=8, local_world_size=4, group_rank=1,
        ...                 group_world_size=2)
        >>> w.rank, w.local_rank
        (5, 1)
    """

    node_id: str
    local_rank: int
    rank: int
    world_size: int
    role: str
    role_rank: int
    role_world_size: int
    local_world_size: int
    group_rank: int
    group_world_size: int


def _int_key(value: object) -> tuple[int, Any]:
    # Sort key tolerating wrongly typed fields (validation reports them later).
    return (0, value) if is_int(value) else (1, repr(value))


def _worker_sort_key(worker: WorkerRanks) -> tuple[Any, ...]:
    # Strategies may return workers in any order; a canonical order makes equal assignments
    # compare equal.
    return (_int_key(worker.rank), _int_key(worker.group_rank), _int_key(worker.local_rank), str(worker.node_id))


@dataclass(frozen=True)
class RankAssignment:
    """The ranks of every worker in the job, in global-rank order.

    Build it from the workers in any order; :attr:`workers` is sorted by global rank.
    :meth:`for_node` gives one node's workers in local-rank order. Construction does not check
    the ranks: :func:`~rallypoint.agent.ranks.validate_assignment` does.

    Attributes:
        workers: every worker's ranks, sorted by global rank.

    Examples:
        >>> from rallypoint.agent.ranks import assign_blocks
        >>> nodes = [RankNode(node_id="a", group_rank=0, host="a", local_world_size=1),
        ...          RankNode(node_id="b", group_rank=1, host="b", local_world_size=2)]
        >>> assignment = assign_blocks(nodes)
        >>> assignment.world_size
        3
        >>> [w.rank for w in assignment.for_node("b")]
        [1, 2]
    """

    workers: tuple[WorkerRanks, ...]
    _by_node: Mapping[str, tuple[WorkerRanks, ...]] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        workers = tuple(sorted(self.workers, key=_worker_sort_key))
        object.__setattr__(self, "workers", workers)
        by_node: dict[str, list[WorkerRanks]] = {}
        for worker in workers:
            by_node.setdefault(worker.node_id, []).append(worker)
        object.__setattr__(
            self,
            "_by_node",
            MappingProxyType(
                {node_id: tuple(sorted(ws, key=lambda w: _int_key(w.local_rank))) for node_id, ws in by_node.items()}
            ),
        )

    @property
    def by_node(self) -> Mapping[str, tuple[WorkerRanks, ...]]:
        """Every node's workers, in local-rank order, by node id (read-only)."""
        return self._by_node

    def for_node(self, node_id: str) -> tuple[WorkerRanks, ...]:
        """The workers of ``node_id`` in local-rank order.

        Raises:
            KeyError: the assignment has no worker on that node.
        """
        try:
            return self._by_node[node_id]
        except KeyError:
            raise KeyError(f"no worker is assigned to node {node_id!r}") from None

    @property
    def world_size(self) -> int:
        """Number of workers in the job."""
        return len(self.workers)

    def __len__(self) -> int:
        return len(self.workers)

    def __iter__(self) -> Iterator[WorkerRanks]:
        return iter(self.workers)
