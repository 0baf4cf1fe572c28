"""Tests of rallypoint.agent.ranks: data model, the default strategy, validation, loading.

Node labels are tested with the rest of node identity in ``test_node.py``; the assignment
helpers in ``test_ranks_blocks.py``.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Sequence
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.agent.ranks import (
    DEFAULT_ROLE,
    DefaultStrategy,
    RankAssignment,
    RankAssignmentError,
    RankNode,
    RankStrategy,
    WorkerRanks,
    check_nodes,
    compute_assignment,
    load_strategy,
    validate_assignment,
)
from rallypoint.agent.records import RANK_STRATEGIES, RankStrategyRecord
from rallypoint.core.config import Selection, load_job_config, resolve_config
from rallypoint.core.errors import ConfigError, PluginError, RallypointError
from rallypoint.core.plugins import get_plugin_manager, hookimpl

PREFIX = "rank strategy 'bad' produced an invalid assignment: "


def node(node_id: str, group_rank: int, lws: int, role: str = DEFAULT_ROLE, **kw: Any) -> RankNode:
    return RankNode(
        node_id=node_id, group_rank=group_rank, host=f"host-{node_id}", local_world_size=lws, role=role, **kw
    )


def two_nodes() -> list[RankNode]:
    return [node("a", 0, 2), node("b", 1, 2)]


# ---------------------------------------------------------------------------------------------
# Hypothesis: random node sets


@st.composite
def node_sets(
    draw: st.DrawFn, *, roles: Sequence[str] = ("default", "trainer", "eval"), max_nodes: int = 10, max_lws: int = 8
) -> list[RankNode]:
    """Nodes with unique ids, group ranks 0..G-1 in random list order, random sizes and roles."""
    count = draw(st.integers(1, max_nodes))
    ids = draw(
        st.lists(st.text("abcdefghij0123456789-", min_size=1, max_size=6), min_size=count, max_size=count, unique=True)
    )
    group_ranks = draw(st.permutations(range(count)))
    return [
        RankNode(
            node_id=node_id,
            group_rank=group_rank,
            host=draw(st.sampled_from(["h0", "h1", "h2"])),
            local_world_size=draw(st.integers(1, max_lws)),
            role=draw(st.sampled_from(list(roles))),
        )
        for node_id, group_rank in zip(ids, group_ranks, strict=True)
    ]


def reference(nodes: Sequence[RankNode]) -> dict[tuple[str, int], tuple[int, int]]:
    """torch's rule, computed naively: (node_id, local_rank) -> (rank, role_rank)."""
    out = {}
    for n in nodes:
        base = sum(m.local_world_size for m in nodes if m.group_rank < n.group_rank)
        role_base = sum(m.local_world_size for m in nodes if m.group_rank < n.group_rank and m.role == n.role)
        for local_rank in range(n.local_world_size):
            out[(n.node_id, local_rank)] = (base + local_rank, role_base + local_rank)
    return out


@settings(max_examples=200, deadline=None)
@given(node_sets())
def test_default_assignment_is_valid_and_matches_torch_rule(nodes: list[RankNode]) -> None:
    assignment = compute_assignment(DefaultStrategy(), nodes)  # validates
    validate_assignment(assignment, nodes, "default")
    total = sum(n.local_world_size for n in nodes)
    assert assignment.world_size == len(assignment) == total
    assert [w.rank for w in assignment] == list(range(total))
    expected = reference(nodes)
    assert {(w.node_id, w.local_rank): (w.rank, w.role_rank) for w in assignment} == expected
    for n in nodes:
        workers = assignment.for_node(n.node_id)
        assert [w.local_rank for w in workers] == list(range(n.local_world_size))
        ranks = [w.rank for w in workers]
        assert ranks == list(range(ranks[0], ranks[0] + n.local_world_size))  # contiguous per node
        assert {(w.role, w.group_rank, w.group_world_size, w.local_world_size) for w in workers} == {
            (n.role, n.group_rank, len(nodes), n.local_world_size)
        }


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_default_assignment_is_independent_of_input_order(data: st.DataObject) -> None:
    nodes = data.draw(node_sets())
    shuffled = data.draw(st.permutations(nodes))
    first = DefaultStrategy().assign(nodes, None)
    second = DefaultStrategy().assign(shuffled, None)
    assert first == second
    assert first.workers == second.workers
    assert dict(first.by_node) == dict(second.by_node)


@settings(max_examples=100, deadline=None)
@given(nnodes=st.integers(1, 16), lws=st.integers(1, 8), data=st.data())
def test_homogeneous_single_role_matches_torch_formula(nnodes: int, lws: int, data: st.DataObject) -> None:
    order = data.draw(st.permutations(range(nnodes)))
    nodes = [node(f"n{g}", g, lws) for g in order]
    assignment = compute_assignment(DefaultStrategy(), nodes)
    for w in assignment:
        assert w.rank == w.group_rank * lws + w.local_rank
        assert w.role_rank == w.rank
        assert w.world_size == w.role_world_size == nnodes * lws
        assert w.group_world_size == nnodes


@settings(max_examples=100, deadline=None)
@given(node_sets())
def test_role_ranks_are_dense_per_role(nodes: list[RankNode]) -> None:
    assignment = DefaultStrategy().assign(nodes, None)
    for role in {n.role for n in nodes}:
        size = sum(n.local_world_size for n in nodes if n.role == role)
        workers = [w for w in assignment if w.role == role]
        assert sorted(w.role_rank for w in workers) == list(range(size))
        assert {w.role_world_size for w in workers} == {size}
        # role ranks follow global-rank order within the role
        assert [w.role_rank for w in sorted(workers, key=lambda w: w.rank)] == list(range(size))


# ---------------------------------------------------------------------------------------------
# Explicit examples


def test_heterogeneous_example() -> None:
    nodes = [node("c", 2, 3), node("a", 0, 1), node("b", 1, 4)]
    assignment = compute_assignment(DefaultStrategy(), nodes)
    assert [(w.node_id, w.local_rank, w.rank) for w in assignment] == [
        ("a", 0, 0),
        ("b", 0, 1),
        ("b", 1, 2),
        ("b", 2, 3),
        ("b", 3, 4),
        ("c", 0, 5),
        ("c", 1, 6),
        ("c", 2, 7),
    ]
    assert {w.world_size for w in assignment} == {8}
    assert [w.local_world_size for w in assignment.for_node("b")] == [4, 4, 4, 4]


def test_roles_interleave_in_group_rank_order_and_are_not_sorted() -> None:
    nodes = [
        node("t0", 0, 2, "trainer"),
        node("e0", 1, 1, "eval"),
        node("t1", 2, 2, "trainer"),
        node("e1", 3, 3, "eval"),
    ]
    assignment = compute_assignment(DefaultStrategy(), nodes)
    assert [(w.rank, w.role, w.role_rank, w.role_world_size) for w in assignment] == [
        (0, "trainer", 0, 4),
        (1, "trainer", 1, 4),
        (2, "eval", 0, 4),
        (3, "trainer", 2, 4),
        (4, "trainer", 3, 4),
        (5, "eval", 1, 4),
        (6, "eval", 2, 4),
        (7, "eval", 3, 4),
    ]


def test_single_node_single_worker() -> None:
    (worker,) = compute_assignment(DefaultStrategy(), [node("only", 0, 1)]).workers
    assert worker == WorkerRanks(
        node_id="only",
        local_rank=0,
        rank=0,
        world_size=1,
        role="default",
        role_rank=0,
        role_world_size=1,
        local_world_size=1,
        group_rank=0,
        group_world_size=1,
    )


def test_rank_assignment_sorts_workers_and_groups_by_node() -> None:
    workers = list(DefaultStrategy().assign(two_nodes(), None))
    reordered = RankAssignment(tuple(reversed(workers)))
    assert reordered == RankAssignment(tuple(workers))
    assert [w.rank for w in reordered] == [0, 1, 2, 3]
    assert [w.local_rank for w in reordered.for_node("b")] == [0, 1]
    assert set(reordered.by_node) == {"a", "b"}
    with pytest.raises(KeyError, match="no worker is assigned to node 'zz'"):
        reordered.for_node("zz")
    with pytest.raises(TypeError):
        reordered.by_node["c"] = ()  # type: ignore[index]


def test_default_strategy_satisfies_protocol() -> None:
    assert isinstance(DefaultStrategy(), RankStrategy)
    assert DefaultStrategy.name == "default"


# ---------------------------------------------------------------------------------------------
# Inputs


def test_rank_node_defaults_and_immutability() -> None:
    labels = {"rack": "r1"}
    n = RankNode(node_id="a", group_rank=0, host="h", local_world_size=2, labels=labels, env={"SLURM_PROCID": "0"})
    assert n.role == "default"
    labels["rack"] = "r2"
    assert n.labels == {"rack": "r1"}
    assert n.env["SLURM_PROCID"] == "0"
    with pytest.raises(TypeError):
        n.labels["x"] = "y"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.group_rank = 1  # type: ignore[misc]
    assert hash(n) == hash(RankNode(node_id="a", group_rank=0, host="h", local_world_size=2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_id": ""}, "RankNode.node_id must be a non-empty string, got ''"),
        ({"group_rank": -1}, "node 'a': group_rank must be an int >= 0, got -1"),
        ({"group_rank": True}, "node 'a': group_rank must be an int >= 0, got True"),
        ({"local_world_size": 0}, "node 'a': local_world_size must be an int >= 1, got 0"),
        ({"local_world_size": "2"}, "node 'a': local_world_size must be an int >= 1, got '2'"),
        ({"role": ""}, "node 'a': role must be a non-empty string, got ''"),
    ],
)
def test_rank_node_rejects_bad_fields(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"node_id": "a", "group_rank": 0, "host": "h", "local_world_size": 1, **kwargs}
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        RankNode(**fields)


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([], "rank assignment needs at least one node"),
        ([node("a", 0, 1), node("a", 1, 1)], "node id 'a' appears more than once"),
        ([node("a", 0, 1), node("b", 2, 1)], "group ranks of the nodes must be 0..1 (one per node), got [0, 2]"),
        ([node("a", 0, 1), node("b", 0, 1)], "group ranks of the nodes must be 0..1 (one per node), got [0, 0]"),
    ],
)
def test_check_nodes(nodes: list[RankNode], message: str) -> None:
    with pytest.raises(ValueError) as info:  # noqa: PT011 - the message is checked exactly below
        check_nodes(nodes)
    assert str(info.value) == message
    with pytest.raises(ValueError) as info:  # noqa: PT011
        compute_assignment(DefaultStrategy(), nodes)
    assert str(info.value) == message


# ---------------------------------------------------------------------------------------------
# Broken strategies: exact messages


class Bad:
    """A strategy that post-processes the default assignment with ``change``."""

    name = "bad"

    def __init__(self, change: Any) -> None:
        self.change = change

    def assign(self, nodes: Sequence[RankNode], options: Any) -> Any:
        return self.change(list(DefaultStrategy().assign(nodes, options)))


def edit(**changes: Any) -> Any:
    """Replace fields of the worker selected by (node_id, local_rank) keys in ``changes``."""

    def change(workers: list[WorkerRanks]) -> RankAssignment:
        out = []
        for w in workers:
            fields = changes.get(f"{w.node_id}{w.local_rank}")
            out.append(dataclasses.replace(w, **fields) if fields else w)
        return RankAssignment(tuple(out))

    return change


def drop(node_id: str, local_rank: int) -> Any:
    def change(workers: list[WorkerRanks]) -> RankAssignment:
        return RankAssignment(tuple(w for w in workers if (w.node_id, w.local_rank) != (node_id, local_rank)))

    return change


def local_only(workers: list[WorkerRanks]) -> RankAssignment:
    """Every node restarts global ranks at 0 (a classic bug)."""
    return RankAssignment(tuple(dataclasses.replace(w, rank=w.local_rank) for w in workers))


def off_by_one(workers: list[WorkerRanks]) -> RankAssignment:
    return RankAssignment(tuple(dataclasses.replace(w, rank=w.rank + 1) for w in workers))


def role_rank_is_rank(workers: list[WorkerRanks]) -> RankAssignment:
    return RankAssignment(tuple(dataclasses.replace(w, role_rank=w.rank) for w in workers))


@pytest.mark.parametrize(
    ("change", "nodes", "detail"),
    [
        pytest.param(
            local_only,
            two_nodes(),
            "global rank 0 is given to both node 'a' local rank 0 and node 'b' local rank 0",
            id="duplicate-global-rank",
        ),
        pytest.param(
            off_by_one,
            two_nodes(),
            "node 'b' local rank 1: global rank 4 is outside 0..3",
            id="global-rank-out-of-range",
        ),
        pytest.param(
            drop("b", 1),
            two_nodes(),
            "node 'b' (group rank 1, host 'host-b'): local ranks are [0], expected 0..1 (local_world_size 2)",
            id="missing-worker",
        ),
        pytest.param(
            edit(a1={"local_rank": 0}),
            two_nodes(),
            "node 'a' (group rank 0, host 'host-a'): local ranks are [0, 0], expected 0..1 (local_world_size 2)",
            id="duplicate-local-rank",
        ),
        pytest.param(
            edit(b1={"local_rank": 5}),
            two_nodes(),
            "node 'b' (group rank 1, host 'host-b'): local ranks are [0, 5], expected 0..1 (local_world_size 2)",
            id="local-rank-out-of-range",
        ),
        pytest.param(
            edit(a0={"node_id": "zz"}),
            two_nodes(),
            "node 'zz' local rank 0 (global rank 0): unknown node 'zz'; known nodes: 'a', 'b'",
            id="unknown-node",
        ),
        pytest.param(
            edit(b0={"rank": "2"}),
            two_nodes(),
            "node 'b' local rank 0: rank is '2', not an int",
            id="rank-not-int",
        ),
        pytest.param(
            edit(a1={"world_size": 3}),
            two_nodes(),
            "node 'a' local rank 1: world_size is 3, expected 4 (sum of local_world_size over 2 node(s))",
            id="wrong-world-size",
        ),
        pytest.param(
            edit(b0={"local_world_size": 3}),
            two_nodes(),
            "node 'b' local rank 0: local_world_size is 3, expected 2",
            id="wrong-local-world-size",
        ),
        pytest.param(
            edit(b0={"group_rank": 0}),
            two_nodes(),
            "node 'b' local rank 1: group_rank is 1, expected 0 (as local rank 0: a node's workers share one"
            " group rank)",
            id="wrong-group-rank",
        ),
        pytest.param(
            edit(a0={"group_rank": 1}, a1={"group_rank": 1}),
            two_nodes(),
            "group rank 1 is given to both node 'a' and node 'b'",
            id="group-rank-twice",
        ),
        pytest.param(
            edit(b0={"group_rank": 2}, b1={"group_rank": 2}),
            two_nodes(),
            "node 'b' local rank 0: group rank 2 is outside 0..1",
            id="group-rank-outside",
        ),
        pytest.param(
            edit(a0={"group_world_size": 1}),
            two_nodes(),
            "node 'a' local rank 0: group_world_size is 1, expected 2",
            id="wrong-group-world-size",
        ),
        pytest.param(
            edit(a0={"role": "eval"}),
            two_nodes(),
            "node 'a' local rank 0: role is 'eval', expected 'default'",
            id="wrong-role",
        ),
        pytest.param(
            role_rank_is_rank,
            [node("a", 0, 2, "trainer"), node("b", 1, 2, "eval")],
            "node 'b' local rank 0: role rank 2 is outside 0..1 for role 'eval'",
            id="role-rank-out-of-range",
        ),
        pytest.param(
            edit(b1={"role_rank": 0}),
            [node("a", 0, 1, "trainer"), node("b", 1, 2, "eval")],
            "role 'eval' rank 0 is given to both node 'b' local rank 0 and node 'b' local rank 1",
            id="duplicate-role-rank",
        ),
        pytest.param(
            edit(a0={"role_world_size": 4}),
            [node("a", 0, 1, "trainer"), node("b", 1, 2, "eval")],
            "node 'a' local rank 0: role_world_size is 4, expected 1 (workers with role 'trainer')",
            id="wrong-role-world-size",
        ),
        pytest.param(
            lambda workers: workers,
            two_nodes(),
            "expected a RankAssignment, got list",
            id="not-an-assignment",
        ),
        pytest.param(
            lambda workers: RankAssignment(()),
            two_nodes(),
            "node 'a' (group rank 0, host 'host-a'): local ranks are [], expected 0..1 (local_world_size 2)",
            id="empty",
        ),
    ],
)
def test_broken_strategies_are_reported_exactly(change: Any, nodes: list[RankNode], detail: str) -> None:
    with pytest.raises(RankAssignmentError) as info:
        compute_assignment(Bad(change), nodes)
    assert str(info.value) == PREFIX + detail
    assert info.value.strategy == "bad"
    assert info.value.detail == detail
    assert isinstance(info.value, RallypointError)


def test_strategy_that_raises_is_reported_with_its_name() -> None:
    def boom(workers: list[WorkerRanks]) -> RankAssignment:
        raise ZeroDivisionError("division by zero")

    with pytest.raises(RankAssignmentError) as info:
        compute_assignment(Bad(boom), two_nodes())
    assert str(info.value) == "rank strategy 'bad' failed: ZeroDivisionError: division by zero"
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_name_override_and_class_name_fallback() -> None:
    class Nameless:
        def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
            return RankAssignment(())

    with pytest.raises(RankAssignmentError, match=r"^rank strategy 'Nameless' produced"):
        compute_assignment(Nameless(), two_nodes())
    with pytest.raises(RankAssignmentError, match=r"^rank strategy 'mine' produced"):
        compute_assignment(Nameless(), two_nodes(), name="mine")


def test_round_robin_strategy_without_contiguous_node_ranks_is_valid() -> None:
    """Contiguous ranks per node are not required: round-robin over nodes passes validation."""

    class RoundRobin:
        name = "round-robin"

        def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
            ordered = sorted(nodes, key=lambda n: n.group_rank)
            total = sum(n.local_world_size for n in ordered)
            slots = [
                (n, lr)
                for lr in range(max(n.local_world_size for n in ordered))
                for n in ordered
                if lr < n.local_world_size
            ]
            return RankAssignment(
                tuple(
                    WorkerRanks(
                        node_id=n.node_id,
                        local_rank=lr,
                        rank=r,
                        world_size=total,
                        role=n.role,
                        role_rank=r,
                        role_world_size=total,
                        local_world_size=n.local_world_size,
                        group_rank=n.group_rank,
                        group_world_size=len(ordered),
                    )
                    for r, (n, lr) in enumerate(slots)
                )
            )

    nodes = [node("a", 0, 2), node("b", 1, 3)]
    assignment = compute_assignment(RoundRobin(), nodes)
    assert [w.rank for w in assignment.for_node("a")] == [0, 2]
    assert [w.rank for w in assignment.for_node("b")] == [1, 3, 4]


# ---------------------------------------------------------------------------------------------
# Records, loading, options, the plugin manager


@pytest.fixture
def strategy_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("rp_test_rank_strategies")

    def reverse(nodes: Sequence[RankNode], options: Any) -> RankAssignment:
        """Ranks in reverse group-rank order (single role)."""
        ordered = sorted(nodes, key=lambda n: -n.group_rank)
        total = sum(n.local_world_size for n in ordered)
        workers, base = [], 0
        for n in ordered:
            for lr in range(n.local_world_size):
                workers.append(
                    WorkerRanks(
                        node_id=n.node_id,
                        local_rank=lr,
                        rank=base + lr,
                        world_size=total,
                        role=n.role,
                        role_rank=base + lr,
                        role_world_size=total,
                        local_world_size=n.local_world_size,
                        group_rank=n.group_rank,
                        group_world_size=len(ordered),
                    )
                )
            base += n.local_world_size
        return RankAssignment(tuple(workers))

    received: list[Any] = []

    class Offset:
        def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
            assert isinstance(options, OffsetOptions)
            received.append(options)
            return DefaultStrategy().assign(nodes, None)

    class OffsetOptions(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        offset: int = 0

    class NeedsArgs:
        def __init__(self, required: int) -> None:
            self.required = required

    module.reverse = reverse  # type: ignore[attr-defined]
    module.Offset = Offset  # type: ignore[attr-defined]
    module.OffsetOptions = OffsetOptions  # type: ignore[attr-defined]
    module.received = received  # type: ignore[attr-defined]
    module.NeedsArgs = NeedsArgs  # type: ignore[attr-defined]
    module.not_callable = 42  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_plugin_manager_registers_default() -> None:
    for pm in (get_plugin_manager(), get_plugin_manager(autoload=False)):
        record = pm.registry(RANK_STRATEGIES).get("default")
        assert isinstance(record, RankStrategyRecord)
        assert record.factory == "rallypoint.agent.ranks:DefaultStrategy"
        assert record.options_model is None
        assert record.summary
        assert pm.registry(RANK_STRATEGIES).entry("default").provider.name == "agent"
        assert isinstance(load_strategy(record), DefaultStrategy)
        nodes = [node("b", 1, 2), node("a", 0, 1)]
        assert compute_assignment(record, nodes) == DefaultStrategy().assign(nodes, None)


def test_function_factory_is_adapted(strategy_module: types.ModuleType) -> None:
    record = RankStrategyRecord(name="reverse", factory="rp_test_rank_strategies:reverse")
    strategy = load_strategy(record)
    assert isinstance(strategy, RankStrategy)
    assignment = compute_assignment(record, [node("a", 0, 1), node("b", 1, 2)])
    assert [(w.node_id, w.rank) for w in assignment] == [("b", 0), ("b", 1), ("a", 2)]


def resolve_ranks(pm: Any, strategy: str, options: dict[str, Any]) -> Selection:
    """The ``ranks.strategy`` selection of a job selecting ``strategy`` with ``options``, as core resolves it."""
    loaded = load_job_config(
        None,
        pm,
        environ={},
        overrides=[
            ("job.entrypoint", "train.py", "test"),
            ("ranks.strategy", strategy, "test"),
            ("ranks.options", options, "test"),
        ],
    )
    selection = resolve_config(loaded, pm).selection("ranks.strategy")
    assert selection is not None
    return selection


@pytest.fixture
def offset_pm(strategy_module: types.ModuleType) -> Any:
    """A plugin manager with the ``offset`` strategy (options model ``OffsetOptions``) registered."""
    record = RankStrategyRecord(
        name="offset", factory="rp_test_rank_strategies:Offset", options_model=strategy_module.OffsetOptions
    )

    class Plugin:
        @hookimpl
        def rallypoint_rank_strategies(self) -> list[RankStrategyRecord]:
            return [record]

    pm = get_plugin_manager()
    pm.register(Plugin(), name="offset-strategy")
    return pm


def test_options_are_validated_once_by_resolution(strategy_module: types.ModuleType, offset_pm: Any) -> None:
    selection = resolve_ranks(offset_pm, "offset", {"offset": 3})
    assert selection.options == strategy_module.OffsetOptions(offset=3)
    record = selection.record
    assert isinstance(record, RankStrategyRecord)
    strategy_module.received.clear()
    assert len(compute_assignment(record, two_nodes(), selection.options)) == 4
    assert strategy_module.received == [selection.options]
    assert strategy_module.received[0] is selection.options  # handed on as given, not validated again
    with pytest.raises(ConfigError) as info:
        resolve_ranks(offset_pm, "offset", {"offset": "x", "extra": 1})
    assert [issue.key for issue in info.value.issues] == ["ranks.options.offset", "ranks.options.extra"]


def test_raw_options_are_refused(strategy_module: types.ModuleType) -> None:
    record = RankStrategyRecord(
        name="offset", factory="rp_test_rank_strategies:Offset", options_model=strategy_module.OffsetOptions
    )
    with pytest.raises(TypeError) as info:
        compute_assignment(record, two_nodes(), {"offset": 3})  # type: ignore[arg-type]
    assert str(info.value) == (
        "rank strategy 'offset': options must be the validated [ranks.options] (OffsetOptions), not a raw dict; "
        "pass the options of the job's resolved ranks.strategy selection (rallypoint.core.config.resolve_config), "
        "or build the model yourself"
    )


def test_options_for_a_strategy_without_options_model() -> None:
    pm = get_plugin_manager()
    selection = resolve_ranks(pm, "default", {})
    assert selection.options is None
    assert isinstance(selection.record, RankStrategyRecord)
    assert len(compute_assignment(selection.record, two_nodes(), selection.options)) == 4
    with pytest.raises(ConfigError) as info:
        resolve_ranks(pm, "default", {"b": 1, "a": 2})
    assert [(issue.key, issue.message) for issue in info.value.issues] == [
        ("ranks.options", "rank strategy 'default' takes no options; remove a, b")
    ]


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (
            "rp_test_rank_strategies:not_callable",
            "rank strategy 'x': 'rp_test_rank_strategies:not_callable' is neither a class, an object with an "
            "'assign' method, nor a function (nodes, options) -> RankAssignment",
        ),
        (
            "rp_test_rank_strategies:NeedsArgs",
            "rank strategy 'x': cannot create 'rp_test_rank_strategies:NeedsArgs': TypeError: ",
        ),
        (
            "rp_test_rank_strategies:missing",
            "'rp_test_rank_strategies' has no attribute 'missing' (for 'rp_test_rank_strategies:missing')",
        ),
    ],
)
def test_load_strategy_errors(strategy_module: types.ModuleType, factory: str, message: str) -> None:
    with pytest.raises(PluginError) as info:
        load_strategy(RankStrategyRecord(name="x", factory=factory))
    assert str(info.value).startswith(message)


# ---------------------------------------------------------------------------------------------
# Previous ranks


def test_previous_rank_defaults_to_none_and_is_checked() -> None:
    assert RankNode(node_id="a", group_rank=0, host="h", local_world_size=1).previous_rank is None
    assert RankNode(node_id="a", group_rank=0, host="h", local_world_size=1, previous_rank=8).previous_rank == 8
    for bad in (-1, True, "3", 1.0):
        with pytest.raises(ValueError, match=r"node 'a': previous_rank must be None or an int >= 0"):
            RankNode(node_id="a", group_rank=0, host="h", local_world_size=1, previous_rank=bad)  # type: ignore[arg-type]
    # the default strategy ignores it
    nodes = [node("a", 0, 2, previous_rank=2), node("b", 1, 2, previous_rank=0)]
    assert [w.rank for w in DefaultStrategy().assign(nodes, None).for_node("a")] == [0, 1]
