"""Registration records of the agent's plugin kinds."""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.core.records import BackendRecord

__all__ = ["RankStrategyRecord"]


@dataclass(frozen=True, kw_only=True)
class RankStrategyRecord(BackendRecord):
    """A rank-assignment strategy, selected with ``[ranks] strategy = "<name>"``.

    Attributes:
        factory: import path of the strategy: a callable from the rendezvous participants (and
            the validated ``[ranks.options]``) to every worker's ranks. It must be pure and
            deterministic: every agent computes the whole assignment from the same inputs.
        options_model: pydantic model of ``[ranks.options]``.
    """
