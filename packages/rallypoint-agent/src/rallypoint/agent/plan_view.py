"""The plan as ``rallypoint run --dry-run`` shows it: one JSON-ready view, printed as JSON or as text.

Both forms come from :func:`plan_data`, which reads every field ``rallypoint run`` acts on from
the :class:`~rallypoint.agent.plan.JobPlan` (nothing is recomputed here), so what a dry run
prints is what the run does: the rendezvous this node joins, this node's record, the rank
strategy, the restart budget, the stop settings, the log directory, the worker command line and
the environment the workers get on top of torchrun's own variables (``RANK`` and the others are
set per worker after each rendezvous).
"""

from __future__ import annotations

import shlex
import signal
from typing import Any

from rallypoint.agent.plan import JobPlan, rendezvous_endpoint

__all__ = ["plan_data", "render_plan"]


def _options(model: Any) -> dict[str, Any] | None:
    dumped: dict[str, Any] | None = model.model_dump(mode="json", exclude_none=True) if model is not None else None
    return dumped


def _launch(plan: JobPlan) -> dict[str, Any] | None:
    """The launch environment the plan was made in (``None``: none was detected)."""
    facts = plan.launch
    if facts is None:
        return None
    return {
        "environment": facts.environment,
        "nnodes": facts.nnodes,
        "hosts": list(facts.hosts),
        "node_rank": facts.node_rank,
        "restart_count": facts.restart_count,
        "variables": list(facts.variables),
    }


def plan_data(plan: JobPlan, address_note: str | None = None) -> dict[str, Any]:
    """Everything ``rallypoint run`` acts on for this node, as JSON values.

    Args:
        plan: the node's plan (:func:`~rallypoint.agent.plan.plan_job`).
        address_note: how this node's address was found, when no flag gave it.
    """
    rdzv, node, settings = plan.rendezvous, plan.node, plan.settings
    timeouts = rdzv.timeouts
    return {
        "run_id": rdzv.run_id,
        "launch": _launch(plan),
        "rendezvous": {
            "backend": rdzv.record.name,
            "where": rendezvous_endpoint(rdzv),
            "options": _options(rdzv.backend.options),
            "min_nodes": rdzv.min_nodes,
            "max_nodes": rdzv.max_nodes,
            "timeouts": {
                "join": timeouts.join,
                "last_call": timeouts.last_call,
                "close": timeouts.close,
                "heartbeat_interval": timeouts.heartbeat_interval,
                "heartbeat_timeout": timeouts.heartbeat_timeout,
            },
            "fingerprint": dict(rdzv.fingerprint),
        },
        "node": {
            "node_id": node.node_id,
            "host": node.host,
            "addr": node.addr,
            "local_world_size": node.local_world_size,
            "labels": dict(node.labels),
            "env": dict(node.env),
            "address_note": address_note,
        },
        "ranks": {"strategy": settings.strategy_name, "options": _options(settings.strategy_options)},
        "agent": {
            "max_restarts": settings.max_restarts,
            "monitor_interval": settings.monitor_interval,
            "exit_barrier_timeout": settings.exit_barrier_timeout,
            "stop_grace": settings.stop_grace,
            "signals": [signal.Signals(s).name for s in settings.signals],
            "notice_signals": [signal.Signals(s).name for s in settings.notice_signals],
            "ignored_signals": [signal.Signals(s).name for s in settings.ignored_signals],
            "restarts_before": settings.restarts_before,
            "fixed_allocation": settings.fixed_allocation,
            "log_dir": str(settings.log_dir),
            "tee": settings.tee if isinstance(settings.tee, str) else list(settings.tee),
            "store_head_start": settings.store_head_start,
            "preload": list(settings.preload),
            "preload_keep": settings.preload_keep,
            "watchdog": settings.watchdog.name if settings.watchdog is not None else None,
            "watchdog_options": _options(settings.watchdog_options),
        },
        "workers": {
            "count": node.local_world_size,
            "argv": list(settings.argv),
            "env": dict(settings.worker_env),
        },
    }


def _launch_lines(launch: dict[str, Any], agent: dict[str, Any]) -> list[str]:
    rank = f"node rank {launch['node_rank']} of {launch['nnodes']}" if launch["node_rank"] is not None else ""
    restarts = f"restarted {launch['restart_count']} time(s) by it" if launch["restart_count"] else ""
    shape = ", ".join(part for part in (rank, restarts) if part)
    lines = [f"# launch environment: {launch['environment']}" + (f" ({shape})" if shape else "")]
    if agent["notice_signals"]:
        outlived = f"; the agent outlives {','.join(agent['ignored_signals'])}" if agent["ignored_signals"] else ""
        lines.append(f"# preemption notices: {','.join(agent['notice_signals'])}{outlived}")
    return lines


def render_plan(data: dict[str, Any]) -> str:
    """The text form of :func:`plan_data`, as comment lines that follow the resolved job."""
    rdzv, node, agent, workers = data["rendezvous"], data["node"], data["agent"], data["workers"]
    nodes = (
        f"{rdzv['min_nodes']}" if rdzv["min_nodes"] == rdzv["max_nodes"] else f"{rdzv['min_nodes']}:{rdzv['max_nodes']}"
    )
    lines = [
        "# the plan (what `rallypoint run` does on this node; --json prints the same)",
        f"# run id: {data['run_id']}",
        f"# rendezvous: {rdzv['where']}, {nodes} node(s)",
        f"# this node: {node['node_id']} at {node['addr']}, {workers['count']} worker(s)",
    ]
    if node["address_note"]:
        lines.append(f"# {node['address_note']}")
    if data["launch"] is not None:
        lines += _launch_lines(data["launch"], agent)
    lines += [
        f"# rank strategy: {data['ranks']['strategy']}",
        f"# restarts: {agent['max_restarts']} for the whole job; workers stopped with "
        f"{agent['stop_grace']:g}s between SIGTERM and SIGKILL; the agent handles {','.join(agent['signals'])}",
        f"# logs: {agent['log_dir']}",
        f"# worker command: {shlex.join(workers['argv'])}",
    ]
    env = workers["env"]
    lines.append("# worker environment (besides RANK, WORLD_SIZE and the other torchrun variables):")
    lines += [f"#   {key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    return "\n".join(lines) + "\n"
