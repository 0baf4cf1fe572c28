"""What a launch environment tells the agent: :class:`LaunchFacts`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["LaunchFacts"]


@dataclass(frozen=True, kw_only=True)
class LaunchFacts:
    """The job's shape as the scheduler that started this agent sees it.

    Attributes:
        environment: the launch environment's name (``"slurm"``).
        nnodes: how many nodes the scheduler started the job on.
        hosts: the job's hosts in the scheduler's order, when it says (the first hosts the
            rendezvous).
        endpoint_host: the host the rendezvous endpoint is on.
        run_id: the job's run id (the scheduler's job id: a requeued job keeps it).
        node_id: this node's identity in the job (its node name), or ``None``.
        node_rank: this node's index among the job's nodes, or ``None``.
        restart_count: how many times the scheduler restarted (requeued) the job.
        preemption_signals: signal names the scheduler sends before it stops the job.
        variables: the environment variables read, for the source of each value.
        fixed_allocation: the job's hosts are all it will have: a lost one is not replaced while
            it runs (a Slurm allocation; not a Kubernetes Job, which recreates a pod).
        origins: for each field above that came from the environment, the variables it was read
            from (``{"nnodes": ("SLURM_JOB_NUM_NODES",)}``): the source labels of what it fills in.
    """

    environment: str
    nnodes: int
    endpoint_host: str
    run_id: str
    hosts: tuple[str, ...] = ()
    node_id: str | None = None
    node_rank: int | None = None
    restart_count: int = 0
    preemption_signals: tuple[str, ...] = ("SIGTERM",)
    variables: tuple[str, ...] = ()
    fixed_allocation: bool = False
    origins: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """How config sources name these values as a whole: ``slurm (launch environment: SLURM_JOB_ID, ...)``."""
        names = ", ".join(self.variables)
        return (
            f"{self.environment} (launch environment: {names})" if names else f"{self.environment} (launch environment)"
        )

    def source_of(self, name: str) -> str:
        """The source label of one field: ``slurm (SLURM_JOB_NODELIST)``; :attr:`source` for one of unknown origin."""
        variables = self.origins.get(name)
        return f"{self.environment} ({', '.join(variables)})" if variables else self.source
