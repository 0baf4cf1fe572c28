"""The agent's sections of the job file: ``[job]``, ``[nodes]``, ``[ranks]`` and ``[agent]``.

This package declares them (``rallypoint_config_sections``); core builds the job-file schema from
what the installed packages declare. ``ranks.strategy`` is a plain name here; core's resolution
looks it up among the rank strategies (:data:`~rallypoint.agent.records.RANK_STRATEGIES`) and
validates ``[ranks.options]`` with the selected strategy's ``options_model``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from rallypoint.core.config import ConfigSection, Duration, PositiveDuration, Section

__all__ = [
    "AGENT_SECTIONS",
    "AgentSection",
    "JobSection",
    "NodesSection",
    "NprocPerNode",
    "RanksSection",
    "Tee",
]


def _nproc(value: Any) -> int | str:
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and value.strip().isdigit() and int(value) >= 1:
        return int(value)
    raise PydanticCustomError(
        "nproc", 'expected a positive number of workers or "auto", got {value}', {"value": repr(value)}
    )


def _tee(value: Any) -> str | list[int]:
    if value in ("all", "rank0", "none"):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return list(value)
    raise PydanticCustomError(
        "tee",
        'expected "all", "rank0", "none" or a list of ranks such as [0, 3], got {value}',
        {"value": repr(value)},
    )


#: Workers per node: a positive number, or ``"auto"`` (GPUs if any, else CPUs).
NprocPerNode = Annotated[int | str, BeforeValidator(_nproc)]
#: Which ranks reach the console: ``"all"``, ``"rank0"``, ``"none"`` or a list of ranks.
Tee = Annotated[str | list[int], BeforeValidator(_tee)]


class JobSection(Section):
    """``[job]``: what each worker runs."""

    name: str | None = Field(default=None, description="Job name; defaults to the job file's stem.")
    entrypoint: str | None = Field(default=None, description="Script (or executable) each worker runs.")
    module: str | None = Field(default=None, description="Python module to run with -m, instead of entrypoint.")
    args: list[str] = Field(default_factory=list, description="Arguments passed to every worker.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for every worker.")

    @model_validator(mode="after")
    def _one_target(self) -> JobSection:
        if self.entrypoint and self.module:
            raise PydanticCustomError(
                "job_target", "set either entrypoint or module, not both (module runs as python -m)"
            )
        return self


class NodesSection(Section):
    """``[nodes]``: how many agents (nodes) and workers per node."""

    min: int = Field(default=1, ge=1, description="Fewest nodes the job runs with.")
    max: int | None = Field(default=None, ge=1, description="Most nodes; defaults to min (fixed size).")
    nproc_per_node: NprocPerNode = Field(default=1, description='Workers per node, or "auto".')

    @model_validator(mode="after")
    def _range(self) -> NodesSection:
        if self.max is not None and self.max < self.min:
            raise PydanticCustomError(
                "nodes_range", "max ({max}) is smaller than min ({min})", {"max": self.max, "min": self.min}
            )
        return self

    @property
    def max_nodes(self) -> int:
        """``max``, or ``min`` when no maximum is set."""
        return self.max if self.max is not None else self.min


class RanksSection(Section):
    """``[ranks]``: the rank-assignment strategy and its options."""

    strategy: str = "default"
    options: dict[str, Any] = Field(default_factory=dict)


class AgentSection(Section):
    """``[agent]``: restarts, monitoring, logs."""

    max_restarts: int = Field(default=3, ge=0, description="Restarts for the whole job, not per agent.")
    monitor_interval: PositiveDuration = 0.1
    exit_barrier_timeout: PositiveDuration = 300.0
    log_dir: str = "runs/{run_id}"
    tee: Tee = "all"
    store_head_start: Duration = Field(
        default=0.05,
        description="How long worker rank 0 (which serves the env:// store) starts before the others.",
    )


#: The sections this package declares, in the order a job file shows them.
AGENT_SECTIONS: tuple[ConfigSection, ...] = (
    ConfigSection("job", JobSection, "what each worker runs"),
    ConfigSection("nodes", NodesSection, "how many nodes, and workers per node"),
    ConfigSection("ranks", RanksSection, "the rank-assignment strategy and its options"),
    ConfigSection("agent", AgentSection, "restarts, monitoring, logs"),
)
