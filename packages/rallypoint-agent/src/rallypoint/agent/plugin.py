"""The agent package as a rallypoint plugin: adds its hook specifications and built-in strategies."""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from rallypoint.agent.records import RankStrategyRecord
from rallypoint.core.plugins import hookimpl
from rallypoint.core.records import CliCommand


@hookimpl
def rallypoint_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Make the agent hooks known."""
    from rallypoint.agent import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def rallypoint_rank_strategies() -> Iterable[RankStrategyRecord]:
    """Register the built-in torchrun-compatible ``default`` rank strategy."""
    return [
        RankStrategyRecord(
            name="default",
            summary="torchrun-compatible: nodes in group-rank order, consecutive ranks per node",
            factory="rallypoint.agent.ranks:DefaultStrategy",
        )
    ]


@hookimpl
def rallypoint_cli_commands() -> Iterable[CliCommand]:
    """``rallypoint run`` and ``rallypoint status``."""
    return [
        CliCommand(
            name="run",
            summary="Run a job: rendezvous, ranks, workers, restarts, reports.",
            command="rallypoint.agent.cli:run",
        ),
        CliCommand(
            name="status",
            summary="Show a running job's round, members, waiting nodes and restarts.",
            command="rallypoint.agent.cli:status",
        ),
    ]
