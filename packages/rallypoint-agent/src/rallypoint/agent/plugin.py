"""The agent package as a rallypoint plugin (essential entry point ``agent``).

It adds its hook specifications, declares the rank-strategy and launch-environment kinds and the
``[job]``, ``[nodes]``, ``[ranks]``, ``[agent]`` and ``[launch]`` sections, and registers the
``default`` strategy, the ``slurm``, ``kubernetes`` and ``none`` launch environments and the
``run`` and ``status`` commands.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pluggy

from rallypoint.agent.records import LAUNCH_ENVIRONMENTS, RANK_STRATEGIES, LaunchEnvironmentRecord, RankStrategyRecord
from rallypoint.core.authoring.kinds import TemplateKind
from rallypoint.core.config import ConfigSection
from rallypoint.core.plugins import hookimpl
from rallypoint.core.records import CliCommand
from rallypoint.core.registry import PluginKind


@hookimpl
def rallypoint_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Make the agent hooks known."""
    from rallypoint.agent import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def rallypoint_plugin_kinds() -> list[PluginKind[Any]]:
    """The rank-strategy kind (``ranks.strategy``) and the launch-environment kind (``launch.environment``)."""
    return [RANK_STRATEGIES, LAUNCH_ENVIRONMENTS]


@hookimpl
def rallypoint_config_sections() -> Iterable[ConfigSection]:
    """``[job]``, ``[nodes]``, ``[ranks]``, ``[agent]``, ``[launch]`` and ``[debug]``."""
    from rallypoint.agent.config import AGENT_SECTIONS
    from rallypoint.agent.debug_config import DEBUG_SECTION

    return (*AGENT_SECTIONS, DEBUG_SECTION)


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
def rallypoint_launch_environments() -> Iterable[LaunchEnvironmentRecord]:
    """The bundled launch environments: ``slurm``, ``kubernetes`` and ``none``."""
    return [
        LaunchEnvironmentRecord(
            name="slurm",
            summary="srun in a Slurm allocation: nodes, endpoint on the first node, run id from the job id",
            factory="rallypoint.agent.launch.slurm:detect",
            order=10,
        ),
        LaunchEnvironmentRecord(
            name="kubernetes",
            summary="a pod of an Indexed Job or JobSet: JOB_COMPLETION_INDEX and the headless service",
            factory="rallypoint.agent.launch.kubernetes:detect",
            order=20,
        ),
        LaunchEnvironmentRecord(
            name="none",
            summary="nothing detected or filled in: flags and the job file only",
            factory="rallypoint.agent.launch.none:detect",
            order=-1,
        ),
    ]


@hookimpl
def rallypoint_cli_commands() -> Iterable[CliCommand]:
    """``rallypoint run``, ``rallypoint status``, ``rallypoint debug`` and ``rallypoint warm``."""
    return [
        CliCommand(
            name="run",
            summary="Run a job: rendezvous, ranks, workers, restarts, reports.",
            command="rallypoint.agent.run_cli:run",
        ),
        CliCommand(
            name="status",
            summary="Show a running job's round, members, waiting nodes and restarts.",
            command="rallypoint.agent.status_cli:status",
        ),
        CliCommand(
            name="debug",
            summary="Look inside a running job: every worker's stacks and collectives (debug stacks).",
            command="rallypoint.agent.debug_cli:debug",
        ),
        CliCommand(
            name="warm",
            summary="List or stop this user's kept warm processes (agent.preload_keep).",
            command="rallypoint.agent.warm.cli:warm",
        ),
    ]


@hookimpl
def rallypoint_plugin_templates() -> list[TemplateKind]:
    """What ``rallypoint plugin new`` writes for the agent's hooks (templates in ``plugin_templates/``).

    Rank strategies, lifecycle and decision hooks, and CLI commands (whose example works on the
    agent's job file).
    """
    templates = "rallypoint.agent:plugin_templates/"
    return [
        TemplateKind(
            name="rank-strategy",
            summary="a rank strategy: which global rank every worker gets",
            hook="rallypoint_rank_strategies",
            requires=("rallypoint-agent",),
            testing=("rallypoint-agent[testing]",),
            templates=templates + "rank-strategy",
            impl="strategy",
            expected=("0=local0", "1=local1"),
            selects="ranks.strategy",
            conformance_kit="rallypoint.agent.ranks.testing",
        ),
        TemplateKind(
            name="hooks",
            summary="lifecycle and decision hooks: worker environment, failures, restarts",
            hook="rallypoint_worker_env",
            requires=("rallypoint-agent",),
            testing=("rallypoint-agent[testing]",),
            templates=templates + "hooks",
            impl="hooks",
            expected=("0=attempt0", "1=attempt0"),
        ),
        TemplateKind(
            name="cli-command",
            summary="a subcommand of the rallypoint command line",
            hook="rallypoint_cli_commands",
            requires=("rallypoint-core",),
            testing=("rallypoint-core[testing]", "rallypoint-agent"),
            templates=templates + "cli-command",
            impl="cli",
        ),
    ]
