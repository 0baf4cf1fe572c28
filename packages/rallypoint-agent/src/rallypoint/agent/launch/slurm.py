"""The ``slurm`` launch environment: an agent started by ``srun`` (one task per node) in an allocation."""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.agent.launch.facts import LaunchFacts
from rallypoint.agent.launch.hostlist import expand_hostlist

__all__ = ["detect"]


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def detect(environ: Mapping[str, str]) -> LaunchFacts | None:
    """The job's shape from Slurm's variables; ``None`` outside a Slurm job step.

    The nodes are those of the allocation (``SLURM_JOB_NODELIST``, expanded; ``SLURM_JOB_NUM_NODES``
    when the list is absent); the rendezvous is on its first node; the run id is ``slurm-<job id>``
    (``SLURM_JOB_ID``: a requeued job keeps it, and ``SLURM_RESTART_COUNT`` counts the requeues);
    this node is ``SLURMD_NODENAME`` at index ``SLURM_NODEID``. ``SLURM_LAUNCH_NODE_IPADDR`` (the
    node ``srun`` ran on, often a login node) is never used.

    Raises:
        HostListError: ``SLURM_JOB_NODELIST`` is not in Slurm's host-list syntax.
    """
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        return None
    used = ["SLURM_JOB_ID", "SLURM_JOB_NODELIST"]
    hosts = tuple(expand_hostlist(nodelist))
    nnodes = _int(environ, "SLURM_JOB_NUM_NODES") or _int(environ, "SLURM_NNODES") or len(hosts)
    node_name = environ.get("SLURMD_NODENAME") or None
    node_rank = _int(environ, "SLURM_NODEID")
    restarts = _int(environ, "SLURM_RESTART_COUNT") or 0
    return LaunchFacts(
        environment="slurm",
        nnodes=nnodes,
        hosts=hosts,
        endpoint_host=hosts[0],
        run_id=f"slurm-{job_id}",
        node_id=node_name,
        node_rank=node_rank,
        restart_count=restarts,
        # scancel and the end of a time limit send SIGTERM; --signal=USR2@90 warns ahead of it
        preemption_signals=("SIGTERM", "SIGUSR2"),
        variables=tuple(used),
    )
