"""The rank-strategy conformance kit: the default strategy passes it, and broken strategies fail it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from rallypoint.agent.ranks import DefaultStrategy, RankAssignment, RankNode, assign_blocks
from rallypoint.agent.ranks.testing import RankStrategyConformance, random_nodes


class TestDefaultStrategy(RankStrategyConformance):
    @pytest.fixture
    def strategy(self) -> DefaultStrategy:
        return DefaultStrategy()


class InListOrder:
    """Broken: ranks follow the order the nodes arrive in, which differs between agents."""

    def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
        return assign_blocks(nodes)


class FlipsOnceEveryoneHasRanks:
    """Broken: reverses the order once every node remembers a previous rank (round 2 moves everyone)."""

    def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
        flip = all(n.previous_rank is not None for n in nodes)
        return assign_blocks(sorted(nodes, key=lambda n: n.node_id, reverse=flip))


class ReadsTheEnvironment:
    """Broken: takes its order from a variable of the process, not from the nodes."""

    def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
        import os

        return assign_blocks(sorted(nodes, key=lambda n: n.node_id, reverse="RANK" in os.environ))


class LosesAWorker:
    """Broken: leaves out the last worker of a node with more than one."""

    def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
        ranks: dict[str, list[int]] = {}
        order = sorted(nodes, key=lambda n: n.node_id)
        start = 0
        for node in order:
            ranks[node.node_id] = list(range(start, start + node.local_world_size))
            start += node.local_world_size
        bigger = next(n for n in order if n.local_world_size > 1)
        ranks[bigger.node_id] = ranks[bigger.node_id][:-1]
        from rallypoint.agent.ranks import assign_ranks

        return assign_ranks(nodes, ranks)


KIT = RankStrategyConformance()


def test_a_strategy_that_depends_on_the_order_of_nodes_fails_agreement() -> None:
    with pytest.raises(AssertionError, match="seed"):
        KIT.test_every_agent_agrees_whatever_the_order_of_nodes(InListOrder(), None)


def test_a_strategy_that_moves_workers_between_rounds_fails_stability() -> None:
    KIT.test_assignments_over_random_node_sets_are_valid(FlipsOnceEveryoneHasRanks(), None)  # valid, though
    with pytest.raises(AssertionError, match="round 2 moved workers"):
        KIT.test_ranks_are_stable_across_rounds(FlipsOnceEveryoneHasRanks(), None)


def test_a_strategy_that_reads_the_environment_fails_purity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(AssertionError):
        KIT.test_inputs_are_not_changed_and_the_environment_is_not_read(ReadsTheEnvironment(), None, monkeypatch)


def test_an_invalid_assignment_fails_with_the_seed_and_the_problem() -> None:
    with pytest.raises(AssertionError, match=r"seed 0 \(\d+ nodes\): .*rank strategy"):
        KIT.test_assignments_over_random_node_sets_are_valid(LosesAWorker(), None)


def test_random_node_sets_are_consistent_and_reproducible() -> None:
    for seed in range(40):
        nodes = random_nodes(seed)
        assert sorted(n.group_rank for n in nodes) == list(range(len(nodes)))
        assert len({n.node_id for n in nodes}) == len(nodes)
        by_host: dict[str, dict[str, str]] = {}
        for n in nodes:  # a host is in one place
            assert by_host.setdefault(n.host, dict(n.labels)) == dict(n.labels)
        assert [(n.node_id, n.group_rank, n.host) for n in random_nodes(seed)] == [
            (n.node_id, n.group_rank, n.host) for n in nodes
        ]
    assert max(len(random_nodes(s)) for s in range(40)) > 8
