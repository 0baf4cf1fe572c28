"""Tests of the assignment helpers: assign_blocks (contiguous blocks in an order) and assign_ranks."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.agent.ranks import (
    DefaultStrategy,
    RankNode,
    assign_blocks,
    assign_ranks,
    validate_assignment,
)


def node(node_id: str, group_rank: int, lws: int, role: str = "default") -> RankNode:
    return RankNode(node_id=node_id, group_rank=group_rank, host=f"host-{node_id}", local_world_size=lws, role=role)


@st.composite
def ordered_nodes(draw: st.DrawFn) -> list[RankNode]:
    """Nodes with group ranks 0..G-1, random sizes and roles, in a random order."""
    count = draw(st.integers(1, 8))
    nodes = [
        node(f"n{g}", g, draw(st.integers(1, 6)), draw(st.sampled_from(["default", "trainer", "eval"])))
        for g in range(count)
    ]
    return list(draw(st.permutations(nodes)))


def naive_blocks(order: Sequence[RankNode]) -> dict[tuple[str, int], tuple[int, int]]:
    """(node_id, local_rank) -> (rank, role_rank), counted worker by worker."""
    out: dict[tuple[str, int], tuple[int, int]] = {}
    rank = 0
    role_next: dict[str, int] = {}
    for n in order:
        for local_rank in range(n.local_world_size):
            out[(n.node_id, local_rank)] = (rank, role_next.get(n.role, 0))
            rank += 1
            role_next[n.role] = role_next.get(n.role, 0) + 1
    return out


@settings(max_examples=200, deadline=None)
@given(ordered_nodes())
def test_blocks_follow_the_order_given(order: list[RankNode]) -> None:
    assignment = assign_blocks(order)
    validate_assignment(assignment, order, "blocks")
    assert {(w.node_id, w.local_rank): (w.rank, w.role_rank) for w in assignment} == naive_blocks(order)
    starts = [assignment.for_node(n.node_id)[0].rank for n in order]
    assert starts == sorted(starts)  # the first node in the order gets the lowest ranks
    for n in order:
        ranks = [w.rank for w in assignment.for_node(n.node_id)]
        assert ranks == list(range(ranks[0], ranks[0] + n.local_world_size))  # contiguous per node
    for w in assignment:
        n = next(m for m in order if m.node_id == w.node_id)
        assert (w.group_rank, w.local_world_size, w.group_world_size) == (n.group_rank, n.local_world_size, len(order))


@settings(max_examples=100, deadline=None)
@given(ordered_nodes())
def test_default_strategy_is_blocks_in_group_rank_order(nodes: list[RankNode]) -> None:
    in_group_order = sorted(nodes, key=lambda n: n.group_rank)
    assert DefaultStrategy().assign(nodes, None) == assign_blocks(in_group_order)


def test_blocks_example_with_roles() -> None:
    order = [node("e", 1, 1, "eval"), node("t1", 2, 2, "trainer"), node("t0", 0, 2, "trainer")]
    assignment = assign_blocks(order)
    validate_assignment(assignment, order, "blocks")
    assert [(w.node_id, w.local_rank, w.rank, w.role, w.role_rank, w.role_world_size) for w in assignment] == [
        ("e", 0, 0, "eval", 0, 1),
        ("t1", 0, 1, "trainer", 0, 4),
        ("t1", 1, 2, "trainer", 1, 4),
        ("t0", 0, 3, "trainer", 2, 4),
        ("t0", 1, 4, "trainer", 3, 4),
    ]


def test_blocks_refuse_a_node_given_twice() -> None:
    a = node("a", 0, 1)
    with pytest.raises(ValueError, match=r"^node id 'a' appears more than once$"):
        assign_blocks([a, a])


def test_assign_ranks_places_single_workers() -> None:
    nodes = [node("a", 0, 2, "trainer"), node("b", 1, 2, "trainer"), node("c", 2, 1, "eval")]
    assignment = assign_ranks(nodes, {"a": [0, 3], "b": [1, 4], "c": [2]})
    validate_assignment(assignment, nodes, "ranks")
    assert [(w.node_id, w.local_rank, w.rank, w.role_rank) for w in assignment] == [
        ("a", 0, 0, 0),
        ("b", 0, 1, 1),
        ("c", 0, 2, 0),
        ("a", 1, 3, 2),
        ("b", 1, 4, 3),
    ]
    assert {w.world_size for w in assignment} == {5}


def test_assign_ranks_refuses_unknown_nodes() -> None:
    with pytest.raises(ValueError, match=r"^ranks are given for unknown node\(s\) 'x', 'y'$"):
        assign_ranks([node("a", 0, 1)], {"a": [0], "y": [1], "x": [2]})
