"""The rendezvous package as a rallypoint plugin (essential entry point ``rendezvous``).

It adds its hook specifications, declares the rendezvous-backend kind and the ``[rendezvous]``
section, and registers the ``memory`` backend.
"""

from __future__ import annotations

from typing import Any

import pluggy

from rallypoint.core.authoring.kinds import TemplateKind
from rallypoint.core.config import ConfigSection
from rallypoint.core.plugins import hookimpl
from rallypoint.core.registry import PluginKind
from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS, RendezvousBackendRecord


@hookimpl
def rallypoint_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Make the rendezvous hooks known."""
    from rallypoint.rendezvous import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def rallypoint_plugin_kinds() -> list[PluginKind[Any]]:
    """The rendezvous-backend kind, selected with ``rendezvous.backend``."""
    return [RENDEZVOUS_BACKENDS]


@hookimpl
def rallypoint_config_sections() -> list[ConfigSection]:
    """``[rendezvous]``."""
    from rallypoint.rendezvous.config import RENDEZVOUS_SECTION

    return [RENDEZVOUS_SECTION]


@hookimpl
def rallypoint_rendezvous_backends() -> list[RendezvousBackendRecord]:
    """The built-in ``memory`` backend (in-process; for tests and single-node jobs)."""
    from rallypoint.rendezvous.memory import MemoryOptions

    return [
        RendezvousBackendRecord(
            name="memory",
            summary="in-process key-value space (tests, single node)",
            factory="rallypoint.rendezvous.memory:create_memory_backend",
            options_model=MemoryOptions,
            multi_host=False,
        )
    ]


@hookimpl
def rallypoint_plugin_templates() -> list[TemplateKind]:
    """What ``rallypoint plugin new rendezvous-backend NAME`` writes (templates in ``plugin_templates/``)."""
    return [
        TemplateKind(
            name="rendezvous-backend",
            summary="a rendezvous backend: the key-value space the agents meet in",
            hook="rallypoint_rendezvous_backends",
            requires=("rallypoint-rendezvous",),
            testing=("rallypoint-rendezvous[testing]", "rallypoint-agent"),
            templates="rallypoint.rendezvous:plugin_templates/rendezvous-backend",
            impl="backend",
            expected=("0=world2", "1=world2"),
            selects="rendezvous.backend",
            conformance_kit="rallypoint.rendezvous.testing",
        )
    ]
