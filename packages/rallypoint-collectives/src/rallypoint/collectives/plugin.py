"""The collectives package as a rallypoint plugin (essential entry point ``collectives``).

It adds its hook specifications and declares the collective-backend kind and the
``[collectives]`` section; the backends themselves come from plugins.
"""

from __future__ import annotations

from typing import Any

import pluggy

from rallypoint.collectives.records import COLLECTIVE_BACKENDS
from rallypoint.core.authoring.kinds import TemplateKind
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


@hookimpl
def rallypoint_plugin_templates() -> list[TemplateKind]:
    """What ``rallypoint plugin new collective-backend NAME`` writes (templates in ``plugin_templates/``)."""
    return [
        TemplateKind(
            name="collective-backend",
            summary="a collective backend: the torch process-group backend workers use",
            hook="rallypoint_collective_backends",
            requires=("rallypoint-collectives",),
            testing=("rallypoint-collectives[testing]", "rallypoint-agent"),
            templates="rallypoint.collectives:plugin_templates/collective-backend",
            impl="backend",
            expected=("0=__NAME__:3", "1=__NAME__:3"),
            third_party=("torch>=2.4",),
            selects="collectives.backend",
            conformance_kit="rallypoint.collectives.testing",
        )
    ]
