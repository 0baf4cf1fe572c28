"""What one attempt's workers on this node are started with: argv, environment and directory.

The agent builds one :class:`AttemptWorkers` per attempt from the rendezvous result and the rank
assignment: each worker's :class:`~rallypoint.agent.env.WorkerContext` (ranks, store, attempt),
the variables the plugins and the job's sections give it (a section's
:class:`~rallypoint.core.config.PerWorker` value filled in for this worker), the watchdog's
connection and the debug directory. The files whose growth shows a worker's progress
(:class:`~rallypoint.core.config.ProgressFile` values) come back with them, for the hang watch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rallypoint.agent.env import WorkerContext, worker_environment
from rallypoint.agent.node_share import NodeShare
from rallypoint.agent.ranks import RankAssignment, WorkerRanks
from rallypoint.agent.settings import AgentSettings
from rallypoint.agent.workers import WorkerSpec
from rallypoint.core.config import PerWorker, ProgressFile

if TYPE_CHECKING:
    from rallypoint.core.plugins import RallypointPluginManager
    from rallypoint.rendezvous.handler import RendezvousResult

#: The worker's debug directory (stack dumps, flight record, hang requests) under the attempt's.
DEBUG_DIR_ENV = "RALLYPOINT_WORKER_DEBUG_DIR"


@dataclass(frozen=True)
class AttemptWorkers:
    """One attempt's workers on this node.

    Attributes:
        specs: how each is started, sorted by rank.
        contexts: each one's context by global rank (its ranks, error file...).
        store: the ``addr:port`` of torch's env:// store (on the node of worker rank 0, wherever it runs).
        progress: each one's files that grow as it makes progress, by global rank.
    """

    specs: list[WorkerSpec]
    contexts: dict[int, WorkerContext]
    store: str
    progress: dict[int, tuple[Path, ...]]

    @property
    def ranks(self) -> dict[int, WorkerRanks]:
        """Each worker's ranks, by global rank."""
        return {rank: ctx.ranks for rank, ctx in self.contexts.items()}


def attempt_workers(
    settings: AgentSettings,
    result: RendezvousResult,
    assignment: NodeShare | RankAssignment,
    *,
    attempt: int,
    attempt_dir: Path,
    host: str,
    pm: RallypointPluginManager | None = None,
    watchdog_env: Callable[[int], Mapping[str, str]] | None = None,
    agent_store: bool = False,
) -> AttemptWorkers:
    """The workers this node starts for one attempt; clears their stale error files.

    Args:
        settings: the agent's settings (argv, cwd, the sections' worker variables...).
        result: the round this attempt runs in.
        assignment: this node's share of the ranks (or the whole job's); it runs those of ``result.node``.
        attempt: the attempt's number (restarts so far).
        attempt_dir: the attempt's directory in the log directory.
        host: this host's name.
        pm: the plugin manager (``rallypoint_worker_env`` hooks), if any.
        watchdog_env: the variables connecting a rank to the watchdog server, if one runs.
        agent_store: the store is served before the workers start (:mod:`rallypoint.agent.agent_store`):
            every worker is a client of it, worker rank 0 too.
    """
    # torch's env:// store is on the node of worker rank 0: every worker connects to it there,
    # wherever the rank strategy put it (not necessarily group rank 0); the share says where
    share = assignment if isinstance(assignment, NodeShare) else NodeShare.of(assignment, result)
    mine = share.workers
    store = share.store
    specs: list[WorkerSpec] = []
    contexts: dict[int, WorkerContext] = {}
    progress: dict[int, tuple[Path, ...]] = {}
    for w in mine:
        ctx = WorkerContext(
            ranks=w,
            run_id=settings.run_id,
            round=result.round,
            attempt=attempt,
            restarts_before=settings.restarts_before,
            max_restarts=settings.max_restarts,
            master_addr=store.master_addr,
            master_port=store.master_port,
            error_file=attempt_dir / f"rank_{w.rank}.error.json",
            host=host,
            agent_store=agent_store,
        )
        plugin_env: dict[str, str] = {}
        if pm is not None:
            for given in pm.hook.rallypoint_worker_env(worker=ctx) or []:
                plugin_env.update(given or {})
        # a section's value that differs per worker (the timeline's log...) is filled in for this one
        extra: dict[str, str] = {}
        files: list[Path] = []
        for key, value in settings.worker_env.items():
            if isinstance(value, PerWorker):
                extra[key] = value.fill(rank=w.rank, local_rank=w.local_rank, attempt_dir=attempt_dir)
                if isinstance(value, ProgressFile):
                    files.append(Path(extra[key]))
            else:
                extra[key] = value
        if watchdog_env is not None:
            extra.update(watchdog_env(w.rank))
        extra[DEBUG_DIR_ENV] = str(attempt_dir / "debug")  # stacks and flight record (#40)
        env = worker_environment(ctx, base=os.environ, extra=extra, plugin_env=plugin_env)
        with contextlib.suppress(FileNotFoundError):
            ctx.error_file.unlink()
        specs.append(WorkerSpec(rank=w.rank, argv=list(settings.argv), env=env, cwd=settings.cwd))
        contexts[w.rank] = ctx
        progress[w.rank] = tuple(files)
    specs.sort(key=lambda spec: spec.rank)
    return AttemptWorkers(specs, contexts, f"{store.master_addr}:{store.master_port}", progress)
