# ruff: noqa: D102  (the test methods are named for what they check)
"""The rank-strategy conformance kit: a reusable pytest suite every strategy runs against itself.

Usage, in a strategy's test module::

    import pytest
    from rallypoint.agent.ranks.testing import RankStrategyConformance

    class TestMyStrategy(RankStrategyConformance):
        @pytest.fixture
        def strategy(self):
            return MyStrategy()

        @pytest.fixture  # optional: the validated [ranks.options] (default: None)
        def options(self):
            return MyOptions(spread=True)

The kit runs the strategy over many random node sets (1 to 33 nodes, 1 to 8 workers each, up
to three roles, random hosts, some shared by several nodes, rack and switch labels per host,
random ``previous_rank`` values; seeded, so a failure names a seed that reproduces it) and checks:

* **assignment invariants**: the result passes
  :func:`~rallypoint.agent.ranks.validate_assignment` (every worker of every node gets one global
  rank in ``0..N-1``, local ranks ``0..L-1``, role ranks per role, consistent sizes);
* **agreement**: the same nodes in any order, or as copies, give the same assignment (every agent
  computes it on its own and all must agree);
* **stability across rounds**: when the same nodes meet again with the same group ranks, each
  remembering its previous lowest rank (``previous_rank``, as the agent publishes it), every
  worker keeps its rank;
* **membership changes**: after a node leaves or joins, the new assignment is still valid;
* **purity**: the strategy does not change its inputs and reads no process environment.

A strategy whose ranks do not depend on group ranks at all may set ``group_rank_independent =
True`` on its test class: the kit then also checks that renumbering the group ranks moves no
worker.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from rallypoint.agent.ranks.loading import compute_assignment
from rallypoint.agent.ranks.model import RankAssignment, RankNode
from rallypoint.agent.ranks.strategy import RankStrategy

__all__ = ["RankStrategyConformance", "random_nodes", "renumbered", "with_previous_ranks"]

#: Seeds of the random node sets (each test runs over all of them).
SEEDS = tuple(range(40))
_ROLES = ("trainer", "eval", "server")


def random_nodes(seed: int, *, max_nodes: int = 33) -> list[RankNode]:
    """A random, consistent set of nodes (group ranks ``0..G-1``), reproducible from ``seed``.

    Examples:
        >>> nodes = random_nodes(3)
        >>> sorted(n.group_rank for n in nodes) == list(range(len(nodes)))
        True
    """
    rng = random.Random(seed)
    count = rng.randint(1, max_nodes)
    roles = _ROLES[: rng.randint(1, len(_ROLES))]
    hosts = [f"host-{rng.randrange(10_000):04d}" for _ in range(count)]
    # a host is in one place: every node on a host publishes the host's labels
    labels = {
        host: {"rack": f"r{rng.randrange(4)}", "switch": f"s{rng.randrange(2)}"} if rng.random() < 0.7 else {}
        for host in hosts
    }
    group_ranks = list(range(count))
    rng.shuffle(group_ranks)
    nodes = []
    for i in range(count):
        host = hosts[i] if rng.random() < 0.9 else hosts[0]  # a few nodes share a host
        nodes.append(
            RankNode(
                node_id=f"node-{seed}-{i}",
                group_rank=group_ranks[i],
                host=host,
                local_world_size=rng.randint(1, 8),
                role=rng.choice(roles),
                labels=labels[host],
                previous_rank=rng.randrange(64) if rng.random() < 0.3 else None,
            )
        )
    return nodes


def with_previous_ranks(nodes: Sequence[RankNode], assignment: RankAssignment) -> list[RankNode]:
    """``nodes`` as they come to the next round: each with its lowest rank of ``assignment``."""
    lowest = {node.node_id: min(w.rank for w in assignment.for_node(node.node_id)) for node in nodes}
    return [dataclasses.replace(node, previous_rank=lowest[node.node_id]) for node in nodes]


def renumbered(nodes: Sequence[RankNode], seed: int) -> list[RankNode]:
    """``nodes`` with their group ranks shuffled (a rendezvous may number nodes differently each round)."""
    order = list(range(len(nodes)))
    random.Random(seed).shuffle(order)
    return [dataclasses.replace(node, group_rank=order[i]) for i, node in enumerate(nodes)]


def _ranks(assignment: RankAssignment) -> dict[tuple[str, int], tuple[int, int]]:
    return {(w.node_id, w.local_rank): (w.rank, w.role_rank) for w in assignment}


def _snapshot(nodes: Sequence[RankNode]) -> list[tuple[Any, ...]]:
    return [
        (n.node_id, n.group_rank, n.host, n.local_world_size, n.role, dict(n.labels), dict(n.env), n.previous_rank)
        for n in nodes
    ]


def _compact(nodes: Sequence[RankNode]) -> list[RankNode]:
    """Group ranks renumbered ``0..G-1`` in their current order (after a node left)."""
    ordered = sorted(nodes, key=lambda n: n.group_rank)
    return [dataclasses.replace(node, group_rank=i) for i, node in enumerate(ordered)]


class RankStrategyConformance:
    """Subclass it and provide a ``strategy`` fixture (and ``options`` if the strategy takes any)."""

    #: Set to ``True`` when the strategy's ranks do not depend on group ranks.
    group_rank_independent: bool = False

    @pytest.fixture
    def strategy(self) -> RankStrategy:
        raise NotImplementedError("override the 'strategy' fixture: return the strategy under test")

    @pytest.fixture
    def options(self) -> Any:
        return None

    @staticmethod
    def _assign(strategy: RankStrategy, nodes: Sequence[RankNode], options: Any, seed: int) -> RankAssignment:
        try:
            return compute_assignment(strategy, nodes, options)
        except Exception as exc:
            raise AssertionError(f"seed {seed} ({len(nodes)} nodes): {exc}") from exc

    @staticmethod
    def _cases() -> Iterator[tuple[int, list[RankNode]]]:
        for seed in SEEDS:
            yield seed, random_nodes(seed)

    def test_assignments_over_random_node_sets_are_valid(self, strategy: RankStrategy, options: Any) -> None:
        for seed, nodes in self._cases():
            assignment = self._assign(strategy, nodes, options, seed)
            assert assignment.world_size == sum(n.local_world_size for n in nodes), f"seed {seed}"

    def test_a_single_node_gets_ranks_from_zero(self, strategy: RankStrategy, options: Any) -> None:
        node = RankNode(node_id="only", group_rank=0, host="h", local_world_size=3)
        assignment = self._assign(strategy, [node], options, -1)
        assert sorted(w.rank for w in assignment) == [0, 1, 2]

    def test_every_agent_agrees_whatever_the_order_of_nodes(self, strategy: RankStrategy, options: Any) -> None:
        for seed, nodes in self._cases():
            expected = _ranks(self._assign(strategy, nodes, options, seed))
            shuffled = list(nodes)
            random.Random(seed + 1000).shuffle(shuffled)
            copies = [dataclasses.replace(n) for n in shuffled]
            assert _ranks(self._assign(strategy, copies, options, seed)) == expected, f"seed {seed}"

    def test_ranks_are_stable_across_rounds(self, strategy: RankStrategy, options: Any) -> None:
        for seed, nodes in self._cases():
            first = self._assign(strategy, nodes, options, seed)
            again = with_previous_ranks(nodes, first)
            second = self._assign(strategy, again, options, seed)
            third = self._assign(strategy, with_previous_ranks(again, second), options, seed)
            assert _ranks(second) == _ranks(first), f"seed {seed}: round 2 moved workers"
            assert _ranks(third) == _ranks(second), f"seed {seed}: round 3 moved workers"

    def test_ranks_ignore_group_ranks_when_declared(self, strategy: RankStrategy, options: Any) -> None:
        if not self.group_rank_independent:
            return  # nothing promised: most strategies follow the rendezvous' group ranks
        for seed, nodes in self._cases():
            first = self._assign(strategy, nodes, options, seed)
            moved = self._assign(strategy, renumbered(nodes, seed), options, seed)
            assert _ranks(moved) == _ranks(first), f"seed {seed}: renumbered group ranks moved workers"

    def test_a_node_leaving_or_joining_gives_a_valid_assignment(self, strategy: RankStrategy, options: Any) -> None:
        for seed, nodes in self._cases():
            first = self._assign(strategy, nodes, options, seed)
            survivors = with_previous_ranks(nodes, first)
            if len(survivors) > 1:
                gone = random.Random(seed).randrange(len(survivors))
                self._assign(strategy, _compact(survivors[:gone] + survivors[gone + 1 :]), options, seed)
            newcomer = RankNode(node_id=f"new-{seed}", group_rank=len(survivors), host="new-host", local_world_size=2)
            self._assign(strategy, [*survivors, newcomer], options, seed)

    def test_inputs_are_not_changed_and_the_environment_is_not_read(
        self, strategy: RankStrategy, options: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seed, nodes = next(self._cases())
        before = _snapshot(nodes)
        expected = _ranks(self._assign(strategy, nodes, options, seed))
        monkeypatch.setattr(os, "environ", {"RANK": "7", "WORLD_SIZE": "99", "SLURM_PROCID": "5"})
        assert _ranks(self._assign(strategy, nodes, options, seed)) == expected
        assert _snapshot(nodes) == before
