"""The agent's ranks come with its seat (#38): the strategy runs once per round, not on every node."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from rallypoint.agent.node_share import NodeShare, assign_function, share_of
from rallypoint.agent.ranks import DefaultStrategy, RankAssignment, RankAssignmentError, RankNode, compute_assignment
from rallypoint.agent.settings import AgentSettings
from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.roster import ROSTERS
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

QUIET = RendezvousTimeouts(join=60, last_call=30, close=5, heartbeat_interval=30, heartbeat_timeout=60)


class Counting:
    """torchrun's strategy, counting its runs (and reversing the nodes, so group rank != rank order)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
        self.calls += 1
        if self.fail:
            raise RankAssignmentError("counting", "no ranks for these nodes", raised=True)
        flipped = [
            RankNode(node_id=n.node_id, group_rank=len(nodes) - 1 - n.group_rank, host=n.host, local_world_size=2)
            for n in nodes
        ]
        return DefaultStrategy().assign(sorted(flipped, key=lambda n: n.group_rank), options)


def _settings(strategy: Counting) -> AgentSettings:
    return AgentSettings(argv=["train.py"], run_id="share", strategy=strategy, strategy_name="counting")


def _round(n: int, settings: AgentSettings) -> list[RendezvousResult]:
    run_id = f"share-{uuid.uuid4().hex[:8]}"
    handlers = [
        RendezvousHandler(
            MemoryBackend(run_id),
            make_node(i, local_world_size=2),
            min_nodes=n,
            max_nodes=n,
            timeouts=QUIET,
            assign=assign_function(settings),
        )
        for i in range(n)
    ]
    results: list[Any] = [None] * n
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, handlers[i].next_rendezvous())) for i in range(n)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for h in handlers:
            h.shutdown()
    return results


def test_each_agent_decodes_its_share_and_the_strategy_ran_once() -> None:
    ROSTERS.clear()
    strategy = Counting()
    settings = _settings(strategy)
    results = _round(4, settings)
    shares = [share_of(settings, r) for r in results]
    assert strategy.calls == 1, "the strategy ran on more than the node that completed the round"
    whole = compute_assignment(
        Counting(), [RankNode.from_participant(p, i) for i, p in enumerate(results[0].participants)]
    )
    for r, share in zip(results, shares, strict=True):
        assert share.workers == whole.for_node(r.node.node_id)
        assert share.world_size == 8
        assert share.store == r.store_on(whole.workers[0].node_id)  # where worker rank 0 runs
    assert {w.rank for s in shares for w in s.workers} == set(range(8))


def test_without_a_share_the_agent_computes_its_ranks_from_the_roster() -> None:
    ROSTERS.clear()
    settings = _settings(Counting())
    results = _round(2, _settings(Counting(fail=True)))  # the completing node's strategy failed: no share
    assert [r.assigned for r in results] == [None, None]
    share = share_of(settings, results[0])  # computed here, from the participants
    assert isinstance(share, NodeShare)
    assert share.world_size == 4
    assert len(share.workers) == 2


def test_a_failing_strategy_fails_on_every_node_the_same_way() -> None:
    ROSTERS.clear()
    strategy = Counting(fail=True)
    results = _round(2, _settings(strategy))
    for r in results:
        with pytest.raises(RankAssignmentError, match="no ranks for these nodes"):
            share_of(_settings(strategy), r)


def test_a_share_that_does_not_fit_the_node_is_computed_again() -> None:
    ROSTERS.clear()
    strategy = Counting()
    settings = _settings(strategy)
    results = _round(2, settings)
    calls = strategy.calls
    wrong = {**results[0].assigned, "workers": results[0].assigned["workers"][:1]}  # type: ignore[index]
    forged = RendezvousResult(
        results[0].run_id,
        results[0].round,
        results[0].group_rank,
        results[0].num_nodes,
        results[0].store,
        results[0].node,
        wrong,
        results[0].roster,
        lambda: results[0].participants,
    )
    share = share_of(settings, forged)
    assert strategy.calls == calls + 1
    assert len(share.workers) == 2
