"""Registration records of the agent's plugin kinds."""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.core.records import BackendRecord
from rallypoint.core.registry import PluginKind, SpecialValue

__all__ = ["LAUNCH_ENVIRONMENTS", "RANK_STRATEGIES", "LaunchEnvironmentRecord", "RankStrategyRecord"]


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


@dataclass(frozen=True, kw_only=True)
class LaunchEnvironmentRecord(BackendRecord):
    """A launch environment (a scheduler the agent may be started by), selected with ``[launch] environment``.

    Attributes:
        factory: import path of the detector: a callable from the agent's environment variables
            (a mapping) to a :class:`~rallypoint.agent.launch.LaunchFacts`, or ``None`` when the
            agent was not started there. It must not touch the network or the file system.
        order: where ``auto`` tries it (lower first); an environment that cannot be told apart
            from a plain shell should not be tried by ``auto`` (``order`` < 0).
    """

    order: int = 100


#: The launch-environment kind, declared by this package: ``pm.registry(LAUNCH_ENVIRONMENTS)``.
LAUNCH_ENVIRONMENTS: PluginKind[LaunchEnvironmentRecord] = PluginKind(
    hook="rallypoint_launch_environments",
    label="launch environment",
    record_class=LaunchEnvironmentRecord,
    config_key="launch.environment",
    special=(SpecialValue("auto", "detected at run time", needs_plugin=True),),
)
