"""The environment each worker gets: torchrun's variables plus rallypoint's own.

A script written for torchrun reads the same variables here (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``...), so it runs unmodified. ``MASTER_ADDR``/``MASTER_PORT`` name
the node of worker rank 0 and a port its agent picked for this round. torch's ``env://`` store is
served there by a fork of that agent's warm process when it preloads torch, before the workers
start (``TORCHELASTIC_USE_AGENT_STORE=True``, :mod:`rallypoint.agent.agent_store`), else by worker
rank 0 (``False``); the agent itself never imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rallypoint.agent.ranks.model import WorkerRanks

__all__ = ["PROTECTED", "ROLE_ENV", "WorkerContext", "scheduler_env", "worker_environment"]

#: Variables plugins may not override through ``rallypoint_worker_env``.
PROTECTED = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_ERROR_FILE",
        "RALLYPOINT_ROUND",
    }
)

#: The job's role (``agent.role``) for ``ROLE_NAME``, when the agent sets one other than ``default``.
ROLE_ENV = "RALLYPOINT_ROLE"

_SCHEDULER_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
_SCHEDULER_PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_")


def scheduler_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The rank-related variables a scheduler gave this node, shared through the rendezvous.

    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and every ``SLURM_*`` and
    ``OMPI_COMM_WORLD_*`` variable; the ``env`` rank strategy reads them.
    """
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k in _SCHEDULER_NAMES or any(k.startswith(p) for p in _SCHEDULER_PREFIXES)}


@dataclass(frozen=True)
class WorkerContext:
    """Everything about one worker that its environment is built from (and that hooks see).

    Attributes:
        ranks: the worker's ranks from the rank strategy.
        run_id: the job's run id.
        round: the rendezvous round.
        attempt: job-wide restart count of this run.
        restarts_before: restarts the scheduler made before this run (Slurm's requeues);
            ``TORCHELASTIC_RESTART_COUNT`` is ``restarts_before + attempt``.
        max_restarts: the job-wide restart budget.
        master_addr: group rank 0's address.
        master_port: the port of the ``env://`` store.
        error_file: where the worker writes its error file.
        host: this node's host name.
        agent_store: the store is served before the workers start, not by worker rank 0
            (``TORCHELASTIC_USE_AGENT_STORE``, see :mod:`rallypoint.agent.agent_store`).
    """

    ranks: WorkerRanks
    run_id: str
    round: int
    attempt: int
    max_restarts: int
    master_addr: str
    master_port: int
    error_file: Path
    host: str
    restarts_before: int = 0
    agent_store: bool = False


def worker_environment(
    ctx: WorkerContext,
    *,
    base: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
    plugin_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of one worker.

    Args:
        ctx: the worker.
        base: the agent's environment (inherited by workers, as with torchrun).
        extra: rallypoint's own variables for this job (``RALLYPOINT_COLLECTIVES_BACKEND``,
            job ``[job] env``, watchdog and timeline variables).
        plugin_env: what ``rallypoint_worker_env`` hooks returned; cannot override :data:`PROTECTED`.

    Example:
        >>> from rallypoint.agent.ranks import DefaultStrategy, NodeInfo
        >>> r = DefaultStrategy().assign([NodeInfo(node_id="a", group_rank=0, host="h", local_world_size=2)])
        >>> ctx = WorkerContext(r.workers[1], "job", 0, 0, 3, "127.0.0.1", 29500, Path("e.json"), "h")
        >>> env = worker_environment(ctx, base={})
        >>> env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]
        ('1', '1', '2', '29500')
    """
    r = ctx.ranks
    env = dict(base)
    env.update(extra or {})
    env.update({k: v for k, v in (plugin_env or {}).items() if k not in PROTECTED})
    env.update(
        {
            "RANK": str(r.rank),
            "LOCAL_RANK": str(r.local_rank),
            "WORLD_SIZE": str(r.world_size),
            "LOCAL_WORLD_SIZE": str(r.local_world_size),
            "GROUP_RANK": str(r.group_rank),
            "GROUP_WORLD_SIZE": str(r.group_world_size),
            "ROLE_RANK": str(r.role_rank),
            "ROLE_NAME": (extra or {}).get(ROLE_ENV) or r.role,
            "ROLE_WORLD_SIZE": str(r.role_world_size),
            "MASTER_ADDR": ctx.master_addr,
            "MASTER_PORT": str(ctx.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(ctx.restarts_before + ctx.attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(ctx.max_restarts),
            "TORCHELASTIC_RUN_ID": ctx.run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(ctx.agent_store),
            "TORCHELASTIC_ERROR_FILE": os.path.abspath(ctx.error_file),  # torchrun's is absolute too
            "RALLYPOINT_ROUND": str(ctx.round),
        }
    )
    # torchrun's defaults: one OpenMP thread per worker when several share a node, async NCCL
    # error handling; both only when the user has not chosen.
    if r.local_world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
