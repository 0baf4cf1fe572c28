"""Hook specifications of ``rallypoint-core``.

Every hook is called with keyword arguments only, so a specification can gain an argument
without breaking existing implementations. Subsystem packages add their own specifications
through :func:`rallypoint_addhooks`, declare the kinds of plugins they accept through
:func:`rallypoint_plugin_kinds` and their job-file sections through
:func:`rallypoint_config_sections`, and the plugins ``rallypoint plugin new`` writes for them
through :func:`rallypoint_plugin_templates`: core knows no subsystem in advance.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rallypoint.core.markers import hookspec

if TYPE_CHECKING:
    import pluggy

    from rallypoint.core.authoring.kinds import TemplateKind
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


@hookspec
def rallypoint_plugin_templates() -> Iterable[TemplateKind]:
    """Declare kinds of plugin that ``rallypoint plugin new KIND NAME`` can write.

    A package that accepts a kind of plugin declares how a third-party plugin of that kind is
    made: its dependencies, the hook it implements, the job-file key selecting it, its
    conformance kit, and a directory of templates the package ships. Called when ``plugin new``
    runs (never at start-up).

    Returns:
        :class:`~rallypoint.core.authoring.kinds.TemplateKind` records. Two packages declaring
        different kinds under one name is an error of ``plugin new``.

    Example::

        @hookimpl
        def rallypoint_plugin_templates():
            return [TemplateKind(
                name="widget-backend", summary="a widget backend: how widgets are made",
                hook="rallypoint_widget_backends", requires=("acme-widgets",),
                testing=("acme-widgets[testing]",),
                templates="acme_widgets:plugin_templates/widget-backend", impl="backend",
                expected=("0=made", "1=made"), selects="widgets.backend",
            )]
    """
    return ()
