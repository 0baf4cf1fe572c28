"""Hook implementations of ``rallypoint-core`` itself: the ``plugins`` and ``config`` commands."""

from __future__ import annotations

from rallypoint.core.plugins import hookimpl
from rallypoint.core.records import CliCommand


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
    ]
