"""The ``slurm`` launch environment: an agent started by ``srun`` (one task per node) in an allocation."""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.agent.launch.facts import LaunchFacts
from rallypoint.agent.launch.hostlist import expand_hostlist

__all__ = ["detect"]


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def _first(environ: Mapping[str, str], *names: str, digits: bool = False) -> str | None:
    """The first of ``names`` set (to digits, with ``digits``); ``None`` if none is."""
    for name in names:
        value = environ.get(name, "").strip()
        if value and (value.isdigit() or not digits):
            return name
    return None


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
    job_var = _first(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    list_var = _first(environ, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if job_var is None or list_var is None:
        return None
    hosts = tuple(expand_hostlist(environ[list_var]))
    count_var = _first(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", digits=True)
    origins: dict[str, tuple[str, ...]] = {
        "nnodes": (count_var or list_var,),
        "hosts": (list_var,),
        "endpoint_host": (list_var,),
        "run_id": (job_var,),
    }
    node_name = environ.get("SLURMD_NODENAME") or None
    if node_name is not None:
        origins["node_id"] = ("SLURMD_NODENAME",)
    node_rank = _int(environ, "SLURM_NODEID")
    if node_rank is not None:
        origins["node_rank"] = ("SLURM_NODEID",)
    restarts = _int(environ, "SLURM_RESTART_COUNT")
    if restarts is not None:
        origins["restart_count"] = ("SLURM_RESTART_COUNT",)
    return LaunchFacts(
        environment="slurm",
        nnodes=int(environ[count_var]) if count_var else len(hosts),
        hosts=hosts,
        endpoint_host=hosts[0],
        run_id=f"slurm-{environ[job_var].strip()}",
        node_id=node_name,
        node_rank=node_rank,
        restart_count=restarts or 0,
        # scancel and the end of a time limit send SIGTERM; --signal=USR2@90 warns ahead of it
        preemption_signals=("SIGTERM", "SIGUSR2"),
        fixed_allocation=True,
        variables=tuple(dict.fromkeys(v for names in origins.values() for v in names)),
        origins=origins,
    )
