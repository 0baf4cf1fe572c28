"""The job file's structure (phase 1 of validation).

Plugin names (``rendezvous.backend``, ``ranks.strategy``...) are plain strings here; they are
looked up, and their ``options`` tables validated against each plugin's own model, in phase 2
(:mod:`rallypoint.core.config.resolve`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from rallypoint.core.config.durations import Duration, format_duration

__all__ = [
    "AgentSection",
    "CollectivesSection",
    "JobConfig",
    "JobSection",
    "NodesSection",
    "RanksSection",
    "RendezvousSection",
    "RpcSection",
    "Section",
    "TimerSection",
]


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


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


NprocPerNode = Annotated[int | str, BeforeValidator(_nproc)]
Tee = Annotated[str | list[int], BeforeValidator(_tee)]
PositiveDuration = Annotated[Duration, Field(gt=0)]


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


class RendezvousSection(Section):
    """``[rendezvous]``: how agents find each other. ``options`` belong to the backend."""

    backend: str = "memory"
    run_id: str | None = Field(
        default=None, description="Job identity shared by all agents; generated when standalone."
    )
    join_timeout: PositiveDuration = 600.0
    last_call_timeout: Duration = 5.0
    close_timeout: PositiveDuration = 30.0
    heartbeat_interval: PositiveDuration = 2.0
    heartbeat_timeout: PositiveDuration = 10.0
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _heartbeats(self) -> RendezvousSection:
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise PydanticCustomError(
                "heartbeat",
                "heartbeat_timeout ({timeout}) must be longer than heartbeat_interval ({interval})",
                {
                    "timeout": format_duration(self.heartbeat_timeout),
                    "interval": format_duration(self.heartbeat_interval),
                },
            )
        return self


class RanksSection(Section):
    """``[ranks]``: the rank-assignment strategy and its options."""

    strategy: str = "default"
    options: dict[str, Any] = Field(default_factory=dict)


class CollectivesSection(Section):
    """``[collectives]``: the torch process-group backend for workers."""

    backend: str = "auto"
    timeout: PositiveDuration = 600.0
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


class TimerSection(Section):
    """``[timer]``: watchdog timers and the event timeline."""

    watchdog: str = "off"
    timeline: bool = False
    options: dict[str, Any] = Field(default_factory=dict)


class RpcSection(Section):
    """``[rpc]``: present only in jobs that use ``rallypoint.rpc``."""

    transport: str = "grpc"
    serializer: Literal["safe", "pickle"] = "safe"
    options: dict[str, Any] = Field(default_factory=dict)


class JobConfig(Section):
    """A whole job file. Every section is optional; omitted ones take their defaults.

    Example:
        >>> JobConfig.model_validate({"nodes": {"min": 2, "max": 4}}).nodes.max_nodes
        4
    """

    job: JobSection = Field(default_factory=JobSection)
    nodes: NodesSection = Field(default_factory=NodesSection)
    rendezvous: RendezvousSection = Field(default_factory=RendezvousSection)
    ranks: RanksSection = Field(default_factory=RanksSection)
    collectives: CollectivesSection = Field(default_factory=CollectivesSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    timer: TimerSection = Field(default_factory=TimerSection)
    rpc: RpcSection | None = None


#: Section names, in file order.
SECTIONS: tuple[str, ...] = tuple(JobConfig.model_fields)
