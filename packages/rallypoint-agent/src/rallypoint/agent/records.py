"""Registration records of the agent's plugin kinds."""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.core.records import BackendRecord
from rallypoint.core.registry import PluginKind

__all__ = ["RANK_STRATEGIES", "RankStrategyRecord"]


@dataclass(frozen=True, kw_only=True)
class RankStrategyRecord(BackendRecord):
    """A rank-assignment strategy, selected with ``[ranks] strategy = "<name>"``.

    Attributes:
        factory: import path of the strategy: a callable from the rendezvous participants (and
            the validated ``[ranks.options]``) to every worker's ranks. It must be pure and
            deterministic: every agent computes the whole assignment from the same inputs.
        options_model: pydantic model of ``[ranks.options]``.
    """


#: The rank-strategy kind, declared by this package: ``pm.registry(RANK_STRATEGIES)``.
RANK_STRATEGIES: PluginKind[RankStrategyRecord] = PluginKind(
    hook="rallypoint_rank_strategies",
    label="rank strategy",
    record_class=RankStrategyRecord,
    config_key="ranks.strategy",
)
