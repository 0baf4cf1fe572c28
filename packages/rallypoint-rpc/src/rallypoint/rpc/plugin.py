"""The RPC package as a rallypoint plugin (essential entry point ``rpc``).

It adds its hook specifications and declares the RPC-transport kind and the optional ``[rpc]``
section; the transports themselves come from plugins.
"""

from __future__ import annotations

from typing import Any

import pluggy

from rallypoint.core.authoring.kinds import TemplateKind
from rallypoint.core.config import ConfigSection
from rallypoint.core.plugins import hookimpl
from rallypoint.core.registry import PluginKind
from rallypoint.rpc.records import RPC_TRANSPORTS


@hookimpl
def rallypoint_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Make the RPC hooks known."""
    from rallypoint.rpc import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def rallypoint_plugin_kinds() -> list[PluginKind[Any]]:
    """The RPC-transport kind, selected with ``rpc.transport``."""
    return [RPC_TRANSPORTS]


@hookimpl
def rallypoint_config_sections() -> list[ConfigSection]:
    """``[rpc]`` (optional: only jobs that use RPC have it)."""
    from rallypoint.rpc.config import RPC_SECTION

    return [RPC_SECTION]


@hookimpl
def rallypoint_plugin_templates() -> list[TemplateKind]:
    """What ``rallypoint plugin new rpc-transport NAME`` writes (templates in ``plugin_templates/``)."""
    return [
        TemplateKind(
            name="rpc-transport",
            summary="an RPC transport: how rallypoint.rpc frames travel between workers",
            hook="rallypoint_rpc_transports",
            requires=("rallypoint-rpc",),
            testing=("rallypoint-rpc[testing]", "rallypoint-agent"),
            templates="rallypoint.rpc:plugin_templates/rpc-transport",
            impl="transport",
            expected=("0=peer1", "1=peer0"),
            selects="rpc.transport",
        )
    ]
