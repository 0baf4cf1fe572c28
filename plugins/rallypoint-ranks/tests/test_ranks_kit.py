"""The topology strategy against the rank-strategy conformance kit (it promises stable ranks)."""

from __future__ import annotations

import pytest

from rallypoint.agent.ranks.testing import RankStrategyConformance
from rallypoint_ranks.topology import TopologyOptions, TopologyStrategy


class TestTopologyStrategy(RankStrategyConformance):
    group_rank_independent = True  # ordered by labels and host name, never by group rank

    @pytest.fixture(params=[True, False], ids=["stable", "afresh"])
    def options(self, request: pytest.FixtureRequest) -> TopologyOptions:
        return TopologyOptions(stable=request.param)

    @pytest.fixture
    def strategy(self) -> TopologyStrategy:
        return TopologyStrategy()
