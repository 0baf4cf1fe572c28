"""The collectives package as a rallypoint plugin (essential entry point ``collectives``).

It adds its hook specifications and declares the collective-backend kind and the
``[collectives]`` section; the backends themselves come from plugins.
"""

from __future__ import annotations

from typing import Any

import pluggy

from rallypoint.collectives.records import COLLECTIVE_BACKENDS
from rallypoint.core.config import ConfigSection
from rallypoint.core.plugins import hookimpl
from rallypoint.core.registry import PluginKind


@hookimpl
def rallypoint_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Make the collectives hooks known."""
    from rallypoint.collectives import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def rallypoint_plugin_kinds() -> list[PluginKind[Any]]:
    """The collective-backend kind, selected with ``collectives.backend`` (or ``"auto"``)."""
    return [COLLECTIVE_BACKENDS]


@hookimpl
def rallypoint_config_sections() -> list[ConfigSection]:
    """``[collectives]``."""
    from rallypoint.collectives.config import COLLECTIVES_SECTION

    return [COLLECTIVES_SECTION]
