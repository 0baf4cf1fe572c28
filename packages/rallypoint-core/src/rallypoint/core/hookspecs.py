"""Hook specifications of ``rallypoint-core``.

Every hook is called with keyword arguments only, so a specification can gain an argument
without breaking existing implementations. Subsystem packages add their own specifications
through :func:`rallypoint_addhooks`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rallypoint.core.plugins import hookspec

if TYPE_CHECKING:
    import pluggy

    from rallypoint.core.records import CliCommand


@hookspec(historic=True)
def rallypoint_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add hook specifications of a subsystem or plugin.

    Called once for every plugin, including plugins registered later (the hook is historic).
    A subsystem package uses it to make its own hooks known before any implementation is checked.

    Args:
        pluginmanager: the rallypoint plugin manager.

    Example::

        @hookimpl
        def rallypoint_addhooks(pluginmanager):
            from rallypoint.rendezvous import hookspecs
            pluginmanager.add_hookspecs(hookspecs)
    """


@hookspec
def rallypoint_cli_commands() -> Iterable[CliCommand]:
    """Register subcommands of the ``rallypoint`` command line.

    Returns:
        :class:`~rallypoint.core.records.CliCommand` records. The command object itself is
        imported only when the subcommand runs, so a plugin's heavy imports never slow down
        other commands.

    Example::

        @hookimpl
        def rallypoint_cli_commands():
            return [CliCommand(name="rdzv", summary="Rendezvous server tools",
                               command="rallypoint_grpc.cli:rdzv")]
    """
    return ()
