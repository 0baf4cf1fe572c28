"""The timer package as a rallypoint plugin: adds its hook specifications."""

from __future__ import annotations

import pluggy

from rallypoint.core.plugins import hookimpl


@hookimpl
def rallypoint_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Make the timer hooks known."""
    from rallypoint.timer import hookspecs

    pluginmanager.add_hookspecs(hookspecs)
