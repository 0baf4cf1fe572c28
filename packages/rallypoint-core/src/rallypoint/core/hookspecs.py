"""Hook specifications of ``rallypoint-core``.

Every hook is called with keyword arguments only, so a specification can gain an argument
without breaking existing implementations. Subsystem packages add their own specifications
through :func:`rallypoint_addhooks`, declare the kinds of plugins they accept through
:func:`rallypoint_plugin_kinds` and their job-file sections through
:func:`rallypoint_config_sections`: core knows no subsystem in advance.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rallypoint.core.plugins import hookspec

if TYPE_CHECKING:
    import pluggy

    from rallypoint.core.config.sections import ConfigSection
    from rallypoint.core.records import CliCommand
    from rallypoint.core.registry import PluginKind


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
            from acme_widgets import hookspecs
            pluginmanager.add_hookspecs(hookspecs)
    """


@hookspec
def rallypoint_plugin_kinds() -> Iterable[PluginKind[Any]]:
    """Declare the kinds of plugins a package accepts.

    Called once per plugin manager, after every plugin is registered, when a registry, the
    job-file selectors or ``rallypoint plugins list`` first need the kinds (and again after a
    later registration). A kind's hook must have a specification, added through
    :func:`rallypoint_addhooks` by the same package.

    Returns:
        :class:`~rallypoint.core.registry.PluginKind` objects. Two plugins declaring the same
        hook, or the same config key, is a load failure of the second.

    Example::

        WIDGET_BACKENDS = PluginKind(
            hook="rallypoint_widget_backends", label="widget backend",
            record_class=WidgetBackendRecord, config_key="widgets.backend",
        )

        @hookimpl
        def rallypoint_plugin_kinds():
            return [WIDGET_BACKENDS]
    """
    return ()


@hookspec
def rallypoint_config_sections() -> Iterable[ConfigSection]:
    """Declare sections of the job file (``[widgets]``...).

    Core builds the job-file schema from the sections every installed package declares; a
    section nobody declares is an error naming the known ones. Environment overrides follow the
    declared names: ``RALLYPOINT_<SECTION>_<KEY>``.

    Returns:
        :class:`~rallypoint.core.config.sections.ConfigSection` objects. Two plugins declaring
        one section name is a load failure of the second.

    Example::

        @hookimpl
        def rallypoint_config_sections():
            return [ConfigSection(name="widgets", model=WidgetSection,
                                  summary="how widgets are made")]
    """
    return ()


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
            return [CliCommand(name="widgets", summary="Widget tools",
                               command="acme_widgets.cli:widgets")]
    """
    return ()
