"""Core's own plugin: the CLI-command kind and the ``plugins``, ``config`` and ``plugin`` commands.

Core declares its one plugin kind, :data:`CLI_COMMANDS`, the way every package declares its
own (``rallypoint_plugin_kinds``). It declares no job-file section: those belong to the
packages that read them.
"""

from __future__ import annotations

from typing import Any

from rallypoint.core.markers import hookimpl
from rallypoint.core.records import CliCommand
from rallypoint.core.registry import PluginKind

__all__ = ["CLI_COMMANDS"]

#: Subcommands of the ``rallypoint`` command line (``rallypoint_cli_commands``).
CLI_COMMANDS: PluginKind[CliCommand] = PluginKind(
    hook="rallypoint_cli_commands", label="CLI command", record_class=CliCommand
)


@hookimpl
def rallypoint_plugin_kinds() -> list[PluginKind[Any]]:
    """Core's kind: CLI commands."""
    return [CLI_COMMANDS]


@hookimpl
def rallypoint_cli_commands() -> list[CliCommand]:
    """The core subcommands."""
    return [
        CliCommand(
            name="plugins",
            summary="Show installed plugins and what they register.",
            command="rallypoint.core.commands:plugins",
        ),
        CliCommand(
            name="config",
            summary="Check a job file and show the resolved configuration.",
            command="rallypoint.core.commands:config",
        ),
        CliCommand(
            name="plugin",
            summary="Write a new plugin distribution, or check an installed one.",
            command="rallypoint.core.authoring.cli:plugin",
        ),
    ]
