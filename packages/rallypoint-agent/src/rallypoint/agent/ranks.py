"""Rank assignment: which global, local and role ranks every worker of the job gets.

After a rendezvous round every agent knows the same participants (one :class:`NodeInfo` per
node). A *rank strategy* turns them into the ranks of every worker in the job (a
:class:`RankAssignment`). Strategies are pure and deterministic: each agent computes the whole
assignment locally from the same inputs, so no extra round trip is needed, and every agent
agrees.

Strategies are registered with the ``rallypoint_rank_strategies`` hook
(:class:`~rallypoint.agent.records.RankStrategyRecord`) and selected with
``[ranks] strategy = "<name>"``. The built-in ``default`` strategy (:class:`DefaultStrategy`)
assigns ranks as torchrun does. :func:`compute_assignment` loads a strategy, runs it and checks
the result with :func:`validate_assignment`; a broken result is a :class:`RankAssignmentError`
that names the strategy, the node or rank and what is wrong.

Examples:
    >>> nodes = [NodeInfo(node_id="a", group_rank=0, host="a", local_world_size=2),
    ...          NodeInfo(node_id="b", group_rank=1, host="b", local_world_size=2)]
    >>> assignment = compute_assignment(DefaultStrategy(), nodes)
    >>> [(w.node_id, w.local_rank, w.rank) for w in assignment]
    [('a', 0, 0), ('a', 1, 1), ('b', 0, 2), ('b', 1, 3)]
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from rallypoint.agent.records import RankStrategyRecord
from rallypoint.core.errors import ConfigError, ConfigIssue, PluginError, RallypointError
from rallypoint.core.registry import RANK_STRATEGIES

__all__ = [
    # data model
    "NodeInfo",
    "WorkerRanks",
    "RankAssignment",
    # node labels
    "NODE_LABELS_ENV",
    "NodeLabelsError",
    "parse_node_labels",
    "read_node_labels",
    # strategies
    "RankStrategy",
    "DefaultStrategy",
    "DEFAULT_ROLE",
    # checking and running
    "RankAssignmentError",
    "check_nodes",
    "validate_assignment",
    "load_strategy",
    "compute_assignment",
]

#: The role of a node that does not name one (torchrun's ``--role`` default).
DEFAULT_ROLE = "default"


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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class NodeInfo:
    """One rendezvous participant (node), as every agent sees it after a round.

    Attributes:
        node_id: the participant's unique id in the round.
        group_rank: the node's rank from the rendezvous, ``0..G-1`` over the ``G`` nodes.
        host: the node's host name (for messages and host-based strategies).
        local_world_size: how many workers the node runs (``--nproc-per-node``), at least 1.
        role: the role of the node's workers (torchrun ``--role``).
        labels: free-form labels the node published (rack, switch, GPU model...). The agent
            fills them with :func:`read_node_labels`: the node's labels file (if one is
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
        >>> NodeInfo(node_id="n0", group_rank=0, host="gpu-0", local_world_size=8).role
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
            raise ValueError(f"NodeInfo.node_id must be a non-empty string, got {self.node_id!r}")
        if not _is_int(self.group_rank) or self.group_rank < 0:
            raise ValueError(f"node {self.node_id!r}: group_rank must be an int >= 0, got {self.group_rank!r}")
        if not _is_int(self.local_world_size) or self.local_world_size < 1:
            raise ValueError(
                f"node {self.node_id!r}: local_world_size must be an int >= 1, got {self.local_world_size!r}"
            )
        if not isinstance(self.role, str) or not self.role:
            raise ValueError(f"node {self.node_id!r}: role must be a non-empty string, got {self.role!r}")
        if self.previous_rank is not None and (not _is_int(self.previous_rank) or self.previous_rank < 0):
            raise ValueError(
                f"node {self.node_id!r}: previous_rank must be None or an int >= 0, got {self.previous_rank!r}"
            )
        # Frozen means frozen: callers cannot change the mappings behind the strategy's back.
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


#: The environment variable in which a node publishes its labels (``"rack=r1,zone=z2"``).
NODE_LABELS_ENV = "RALLYPOINT_NODE_LABELS"

_LABEL_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


class NodeLabelsError(RallypointError, ValueError):
    """Node labels (``RALLYPOINT_NODE_LABELS`` or a labels file) that cannot be parsed.

    ``str(error)`` names where the labels came from, the offending item and what is wrong.

    Attributes:
        source: where the text came from, e.g. ``"RALLYPOINT_NODE_LABELS"`` or a file path.
        item: the offending item, as written.
    """

    exit_code = 2

    def __init__(self, source: str, item: str, problem: str) -> None:
        self.source = source
        self.item = item
        super().__init__(
            f"invalid node labels in {source}: {item!r}: {problem}. "
            f"Write labels as key=value pairs separated by commas or new lines, e.g. rack=r1,zone=z2"
        )


def parse_node_labels(text: str, *, source: str = NODE_LABELS_ENV) -> dict[str, str]:
    """Parse node labels written as ``key=value`` pairs, e.g. ``"rack=r1,zone=z2"``.

    The same syntax serves the ``RALLYPOINT_NODE_LABELS`` variable and a labels file: pairs are
    separated by commas or new lines; white space around keys, values and pairs is ignored, as
    are empty pairs and lines starting with ``#``. A key starts with a letter or ``_`` and holds
    letters, digits, ``_``, ``.`` and ``-``; a value is any non-empty text without ``,`` or ``=``
    (quotes are not special).

    Args:
        text: the labels.
        source: where the text came from, for the error message.

    Returns:
        The labels, in the order written.

    Raises:
        NodeLabelsError: a pair without ``=``, an empty or malformed key, an empty value, a value
            containing ``=``, or a key given twice.

    Examples:
        >>> parse_node_labels(" rack=r1, zone = z2 ,")
        {'rack': 'r1', 'zone': 'z2'}
        >>> try:
        ...     parse_node_labels("rack=r1,zone")
        ... except NodeLabelsError as error:
        ...     print(str(error).split(". ")[0])
        invalid node labels in RALLYPOINT_NODE_LABELS: 'zone': expected key=value
    """
    labels: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip().startswith("#"):
            continue
        for raw in line.split(","):
            item = raw.strip()
            if not item:
                continue
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep:
                raise NodeLabelsError(source, item, "expected key=value")
            if not key:
                raise NodeLabelsError(source, item, "the key is empty")
            if not _LABEL_KEY_RE.match(key):
                raise NodeLabelsError(
                    source, item, f"invalid key {key!r} (use letters, digits, '_', '.' and '-', starting with a letter)"
                )
            if not value:
                raise NodeLabelsError(source, item, f"label {key!r} has an empty value")
            if "=" in value:
                raise NodeLabelsError(source, item, f"the value of {key!r} contains '='")
            if key in labels:
                raise NodeLabelsError(source, item, f"label {key!r} is given twice (first as {labels[key]!r})")
            labels[key] = value
    return labels


def read_node_labels(
    environ: Mapping[str, str] | None = None, labels_file: str | os.PathLike[str] | None = None
) -> dict[str, str]:
    """The labels a node publishes: its labels file, then its ``RALLYPOINT_NODE_LABELS``.

    Both use the syntax of :func:`parse_node_labels`. A label set in both takes the variable's
    value (the more specific source wins, as everywhere in rallypoint's configuration).

    Args:
        environ: the node's environment (default :data:`os.environ`).
        labels_file: a file of labels on this node, or ``None``.

    Raises:
        NodeLabelsError: either source cannot be parsed, or the file cannot be read.

    Examples:
        >>> read_node_labels({"RALLYPOINT_NODE_LABELS": "rack=r7"})
        {'rack': 'r7'}
    """
    env = os.environ if environ is None else environ
    labels: dict[str, str] = {}
    if labels_file is not None:
        path = Path(labels_file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise NodeLabelsError(str(path), str(path), f"cannot read the labels file: {exc}") from exc
        labels.update(parse_node_labels(text, source=str(path)))
    labels.update(parse_node_labels(env.get(NODE_LABELS_ENV, ""), source=NODE_LABELS_ENV))
    return labels


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
    return (0, value) if _is_int(value) else (1, repr(value))


def _worker_sort_key(worker: WorkerRanks) -> tuple[Any, ...]:
    # Strategies may return workers in any order; a canonical order makes equal assignments
    # compare equal.
    return (_int_key(worker.rank), _int_key(worker.group_rank), _int_key(worker.local_rank), str(worker.node_id))


@dataclass(frozen=True)
class RankAssignment:
    """The ranks of every worker in the job, in global-rank order.

    Build it from the workers in any order; :attr:`workers` is sorted by global rank.
    :meth:`for_node` gives one node's workers in local-rank order. Construction does not check
    the ranks: :func:`validate_assignment` does.

    Attributes:
        workers: every worker's ranks, sorted by global rank.

    Examples:
        >>> nodes = [NodeInfo(node_id="a", group_rank=0, host="a", local_world_size=1),
        ...          NodeInfo(node_id="b", group_rank=1, host="b", local_world_size=2)]
        >>> assignment = DefaultStrategy().assign(nodes, None)
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


@runtime_checkable
class RankStrategy(Protocol):
    """A rank-assignment strategy.

    ``assign`` must be pure and deterministic: the result depends only on the set of nodes (not
    on the order of ``nodes``) and on ``options``, because every agent computes it independently
    and all must agree. It must not do I/O or read the process environment (use
    :attr:`NodeInfo.env`).

    A registered factory may also be a plain function ``(nodes, options) -> RankAssignment``;
    :func:`load_strategy` adapts it.

    Example::

        class Reversed:
            def assign(self, nodes, options):
                ...  # return a RankAssignment
    """

    def assign(self, nodes: Sequence[NodeInfo], options: Any) -> RankAssignment:
        """Assign ranks to every worker of ``nodes``.

        Args:
            nodes: every participant of the round, in any order.
            options: the validated ``[ranks.options]`` (an instance of the record's
                ``options_model``), or ``None``.
        """
        ...


class DefaultStrategy:
    """The torchrun-compatible strategy (``[ranks] strategy = "default"``).

    Nodes are taken in group-rank order. A node's first global rank is the sum of the local
    world sizes of the nodes before it; its workers get consecutive ranks in local-rank order.
    Role ranks are computed the same way among the nodes of the same role (roles interleave in
    group-rank order; they are not sorted). Local world sizes may differ between nodes. For
    identical nodes with one role this is ``rank = group_rank * local_world_size + local_rank``
    and ``role_rank = rank``. Takes no options.

    Examples:
        >>> nodes = [NodeInfo(node_id="t0", group_rank=0, host="h0", local_world_size=2, role="trainer"),
        ...          NodeInfo(node_id="e0", group_rank=1, host="h1", local_world_size=1, role="eval"),
        ...          NodeInfo(node_id="t1", group_rank=2, host="h2", local_world_size=2, role="trainer")]
        >>> [(w.rank, w.role, w.role_rank) for w in DefaultStrategy().assign(nodes, None)]
        [(0, 'trainer', 0), (1, 'trainer', 1), (2, 'eval', 0), (3, 'trainer', 2), (4, 'trainer', 3)]
    """

    name = "default"

    def assign(self, nodes: Sequence[NodeInfo], options: Any = None) -> RankAssignment:
        """Assign ranks as torchrun does; ``options`` is ignored."""
        ordered = sorted(nodes, key=lambda n: (n.group_rank, n.node_id))
        world_size = sum(n.local_world_size for n in ordered)
        role_sizes: dict[str, int] = {}
        for node in ordered:
            role_sizes[node.role] = role_sizes.get(node.role, 0) + node.local_world_size
        workers: list[WorkerRanks] = []
        base = 0
        role_base: dict[str, int] = dict.fromkeys(role_sizes, 0)
        for node in ordered:
            for local_rank in range(node.local_world_size):
                workers.append(
                    WorkerRanks(
                        node_id=node.node_id,
                        local_rank=local_rank,
                        rank=base + local_rank,
                        world_size=world_size,
                        role=node.role,
                        role_rank=role_base[node.role] + local_rank,
                        role_world_size=role_sizes[node.role],
                        local_world_size=node.local_world_size,
                        group_rank=node.group_rank,
                        group_world_size=len(ordered),
                    )
                )
            base += node.local_world_size
            role_base[node.role] += node.local_world_size
        return RankAssignment(tuple(workers))


def check_nodes(nodes: Sequence[NodeInfo]) -> None:
    """Check the strategy inputs: unique node ids and group ranks exactly ``0..G-1``.

    These come from the rendezvous, so a failure here is a bug there, not in a strategy.

    Raises:
        ValueError: no nodes, a repeated node id, or group ranks that are not ``0..G-1``.

    Examples:
        >>> check_nodes([NodeInfo(node_id="a", group_rank=1, host="a", local_world_size=1)])
        Traceback (most recent call last):
        ...
        ValueError: group ranks of the nodes must be 0..0 (one per node), got [1]
    """
    if not nodes:
        raise ValueError("rank assignment needs at least one node")
    seen: set[str] = set()
    for node in nodes:
        if not isinstance(node, NodeInfo):
            raise ValueError(f"expected NodeInfo, got {node!r}")
        if node.node_id in seen:
            raise ValueError(f"node id {node.node_id!r} appears more than once")
        seen.add(node.node_id)
    group_ranks = sorted(n.group_rank for n in nodes)
    if group_ranks != list(range(len(nodes))):
        raise ValueError(f"group ranks of the nodes must be 0..{len(nodes) - 1} (one per node), got {group_ranks}")


def _describe(worker: WorkerRanks) -> str:
    return f"node {worker.node_id!r} local rank {worker.local_rank!r}"


def _range_text(size: int) -> str:
    return f"0..{size - 1}" if size > 0 else "empty"


def validate_assignment(assignment: RankAssignment, nodes: Sequence[NodeInfo], strategy_name: str) -> None:
    """Check that ``assignment`` is a complete, consistent assignment for ``nodes``.

    Checked, in this order (the first violation is reported):

    * every worker is on a known node and its integer fields are ints;
    * each node has exactly the local ranks ``0..L-1``, ``L`` its ``local_world_size``, and
      its workers carry the node's ``local_world_size``, ``group_rank``, ``role`` and the
      number of nodes as ``group_world_size``;
    * every worker's ``world_size`` is the total ``N`` and the global ranks are ``0..N-1``,
      each used once;
    * per role, ``role_world_size`` is the role's worker count ``R`` and the role ranks are
      ``0..R-1``, each used once.

    Nodes' workers need not have contiguous global ranks.

    Args:
        assignment: what the strategy returned.
        nodes: the strategy's inputs.
        strategy_name: the strategy's name, for the error message.

    Raises:
        RankAssignmentError: the first violation found, naming the node or rank.
        ValueError: ``nodes`` themselves are inconsistent (see :func:`check_nodes`).

    Examples:
        >>> nodes = [NodeInfo(node_id="a", group_rank=0, host="a", local_world_size=2)]
        >>> w = WorkerRanks(node_id="a", local_rank=0, rank=0, world_size=2, role="default",
        ...                 role_rank=0, role_world_size=2, local_world_size=2, group_rank=0,
        ...                 group_world_size=1)
        >>> try:
        ...     validate_assignment(RankAssignment((w,)), nodes, "mine")
        ... except RankAssignmentError as error:
        ...     print(error.detail)
        node 'a' (group rank 0, host 'a'): local ranks are [0], expected 0..1 (local_world_size 2)
    """
    check_nodes(nodes)

    def fail(detail: str) -> RankAssignmentError:
        return RankAssignmentError(strategy_name, detail)

    if not isinstance(assignment, RankAssignment):
        raise fail(f"expected a RankAssignment, got {type(assignment).__name__}")
    by_id = {n.node_id: n for n in nodes}
    group_world_size = len(nodes)

    # Workers: known node, well-typed fields.
    int_fields = (
        "local_rank",
        "rank",
        "world_size",
        "role_rank",
        "role_world_size",
        "local_world_size",
        "group_rank",
        "group_world_size",
    )
    for worker in assignment.workers:
        if not isinstance(worker, WorkerRanks):
            raise fail(f"expected WorkerRanks, got {worker!r}")
        if worker.node_id not in by_id:
            raise fail(
                f"{_describe(worker)} (global rank {worker.rank!r}): unknown node {worker.node_id!r}; "
                f"known nodes: {', '.join(repr(k) for k in sorted(by_id))}"
            )
        for name in int_fields:
            value = getattr(worker, name)
            if not _is_int(value):
                raise fail(f"{_describe(worker)}: {name} is {value!r}, not an int")

    # Per node: local ranks and node-level fields.
    for node in sorted(nodes, key=lambda n: n.group_rank):
        where = f"node {node.node_id!r} (group rank {node.group_rank}, host {node.host!r})"
        workers = assignment.by_node.get(node.node_id, ())
        local_ranks = [w.local_rank for w in workers]
        if local_ranks != list(range(node.local_world_size)):
            raise fail(
                f"{where}: local ranks are {local_ranks}, expected {_range_text(node.local_world_size)} "
                f"(local_world_size {node.local_world_size})"
            )
        expected: dict[str, object] = {
            "local_world_size": node.local_world_size,
            "group_rank": node.group_rank,
            "group_world_size": group_world_size,
            "role": node.role,
        }
        for worker in workers:
            for name, want in expected.items():
                got = getattr(worker, name)
                if got != want:
                    raise fail(f"{_describe(worker)}: {name} is {got!r}, expected {want!r}")

    # Global ranks.
    world_size = sum(n.local_world_size for n in nodes)
    owner: dict[int, WorkerRanks] = {}
    for worker in assignment.workers:
        if worker.world_size != world_size:
            raise fail(
                f"{_describe(worker)}: world_size is {worker.world_size}, expected {world_size} "
                f"(sum of local_world_size over {group_world_size} node(s))"
            )
        if not 0 <= worker.rank < world_size:
            raise fail(f"{_describe(worker)}: global rank {worker.rank} is outside {_range_text(world_size)}")
        if worker.rank in owner:
            raise fail(
                f"global rank {worker.rank} is given to both {_describe(owner[worker.rank])} and {_describe(worker)}"
            )
        owner[worker.rank] = worker

    # Role ranks.
    role_sizes: dict[str, int] = {}
    for node in nodes:
        role_sizes[node.role] = role_sizes.get(node.role, 0) + node.local_world_size
    role_owner: dict[tuple[str, int], WorkerRanks] = {}
    for worker in assignment.workers:
        size = role_sizes[worker.role]
        if worker.role_world_size != size:
            raise fail(
                f"{_describe(worker)}: role_world_size is {worker.role_world_size}, expected {size} "
                f"(workers with role {worker.role!r})"
            )
        if not 0 <= worker.role_rank < size:
            raise fail(
                f"{_describe(worker)}: role rank {worker.role_rank} is outside {_range_text(size)} "
                f"for role {worker.role!r}"
            )
        key = (worker.role, worker.role_rank)
        if key in role_owner:
            raise fail(
                f"role {worker.role!r} rank {worker.role_rank} is given to both "
                f"{_describe(role_owner[key])} and {_describe(worker)}"
            )
        role_owner[key] = worker


class _FunctionStrategy:
    """Adapts a plain function ``(nodes, options) -> RankAssignment`` to :class:`RankStrategy`."""

    def __init__(self, function: Callable[[Sequence[NodeInfo], Any], RankAssignment], name: str) -> None:
        self.function = function
        self.name = name

    def assign(self, nodes: Sequence[NodeInfo], options: Any) -> RankAssignment:
        return self.function(nodes, options)

    def __repr__(self) -> str:
        return f"_FunctionStrategy({self.function!r})"


def load_strategy(record: RankStrategyRecord) -> RankStrategy:
    """Import the strategy a record names and return it as a :class:`RankStrategy`.

    The factory may be a class (instantiated without arguments), an object with ``assign``, or
    a plain function ``(nodes, options) -> RankAssignment``.

    Raises:
        MissingDependencyError: a requirement of the record is not installed.
        PluginError: the factory cannot be imported or is none of the above.

    Examples:
        >>> record = RankStrategyRecord(name="default", factory="rallypoint.agent.ranks:DefaultStrategy")
        >>> type(load_strategy(record)).__name__
        'DefaultStrategy'
    """
    record.check_requirements(RANK_STRATEGIES.label)
    obj = record.load()
    if inspect.isclass(obj):
        try:
            obj = obj()
        except Exception as exc:
            raise PluginError(
                f"rank strategy {record.name!r}: cannot create {record.factory!r}: {type(exc).__name__}: {exc}"
            ) from exc
    if callable(getattr(obj, "assign", None)):
        return obj  # type: ignore[no-any-return]
    if callable(obj):
        return _FunctionStrategy(obj, record.name)
    raise PluginError(
        f"rank strategy {record.name!r}: {record.factory!r} is neither a class, an object with an "
        f"'assign' method, nor a function (nodes, options) -> RankAssignment"
    )


def _options_for(record: RankStrategyRecord, options: Any) -> Any:
    """Validate a raw ``[ranks.options]`` mapping with the record's options model."""
    if not isinstance(options, Mapping):
        return options
    model = record.options_model
    if model is None:
        if options:
            keys = ", ".join(sorted(map(str, options)))
            issue = ConfigIssue(None, "ranks.options", f"rank strategy {record.name!r} takes no options; remove {keys}")
            raise ConfigError([issue])
        return None
    from pydantic import ValidationError

    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        raise ConfigError(
            [
                ConfigIssue(None, ".".join(["ranks.options", *(str(p) for p in err["loc"])]), err["msg"])
                for err in exc.errors()
            ]
        ) from exc


def compute_assignment(
    record_or_strategy: RankStrategyRecord | RankStrategy,
    nodes: Sequence[NodeInfo],
    options: Any = None,
    *,
    name: str | None = None,
) -> RankAssignment:
    """Load (if given a record), run and validate a rank strategy.

    Args:
        record_or_strategy: a registered :class:`RankStrategyRecord`, or a strategy object.
        nodes: every participant of the round, in any order.
        options: the ``[ranks.options]``: an options-model instance, or a raw mapping that is
            validated with the record's ``options_model`` (a record without one accepts only
            an empty mapping or ``None``).
        name: the strategy's name in messages; default: the record's name, the strategy's
            ``name`` attribute, or its class name.

    Returns:
        The validated assignment.

    Raises:
        RankAssignmentError: the strategy raised, or returned an invalid assignment.
        ConfigError: ``options`` do not fit the record's options model.
        PluginError: the strategy cannot be loaded.
        ValueError: ``nodes`` are inconsistent (see :func:`check_nodes`).

    Examples:
        >>> nodes = [NodeInfo(node_id="b", group_rank=1, host="b", local_world_size=1),
        ...          NodeInfo(node_id="a", group_rank=0, host="a", local_world_size=1)]
        >>> record = RankStrategyRecord(name="default", factory="rallypoint.agent.ranks:DefaultStrategy")
        >>> [(w.node_id, w.rank) for w in compute_assignment(record, nodes)]
        [('a', 0), ('b', 1)]
    """
    check_nodes(nodes)
    if isinstance(record_or_strategy, RankStrategyRecord):
        strategy_name = name or record_or_strategy.name
        options = _options_for(record_or_strategy, options)
        strategy = load_strategy(record_or_strategy)
    else:
        strategy = record_or_strategy
        strategy_name = name or getattr(strategy, "name", None) or type(strategy).__name__
    try:
        assignment = strategy.assign(tuple(nodes), options)
    except RallypointError:
        raise
    except Exception as exc:
        raise RankAssignmentError(strategy_name, f"{type(exc).__name__}: {exc}", raised=True) from exc
    validate_assignment(assignment, nodes, strategy_name)
    return assignment
