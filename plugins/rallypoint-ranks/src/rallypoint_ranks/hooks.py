"""rallypoint hooks of the ranks plugin: the ``topology``, ``explicit`` and ``env`` rank strategies.

Select one with ``[ranks] strategy = "<name>"`` and configure it in ``[ranks.options]``, which
the strategy's own options model validates. Only the small options modules are imported here;
every strategy is a pure function of the rendezvous participants and its options.
"""

from __future__ import annotations

from rallypoint.agent.records import RankStrategyRecord
from rallypoint.core.plugins import hookimpl


@hookimpl
def rallypoint_rank_strategies() -> list[RankStrategyRecord]:
    """The ``topology``, ``explicit`` and ``env`` strategies."""
    from rallypoint_ranks.env import EnvOptions
    from rallypoint_ranks.explicit import ExplicitOptions
    from rallypoint_ranks.topology import TopologyOptions

    return [
        RankStrategyRecord(
            name="topology",
            summary="order nodes by labels (zone, switch, rack), then natural host name; stable across rounds",
            factory="rallypoint_ranks.topology:TopologyStrategy",
            options_model=TopologyOptions,
        ),
        RankStrategyRecord(
            name="explicit",
            summary="ranks from a map of host (or pattern) to node rank or to each worker's global rank",
            factory="rallypoint_ranks.explicit:ExplicitStrategy",
            options_model=ExplicitOptions,
        ),
        RankStrategyRecord(
            name="env",
            summary="keep the ranks a scheduler set (torch RANK, Slurm, Open MPI), checked across nodes",
            factory="rallypoint_ranks.env:EnvStrategy",
            options_model=EnvOptions,
        ),
    ]
