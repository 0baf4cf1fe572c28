"""acme-cogs 2.0: a plugin of the made-up widgets subsystem (entry point ``cogs``, group ``rallypoint``).

It registers the ``cog`` widget backend (alias ``cg``, with options), the ``lathe`` gadget
maker and the ``loupe`` inspector, the way a plugin of a real subsystem does.
"""

from __future__ import annotations

from acme_widgets import CogOptions, GadgetMakerRecord, InspectorRecord, WidgetBackendRecord

from rallypoint.core.plugins import hookimpl


@hookimpl
def rallypoint_widget_backends() -> list[WidgetBackendRecord]:
    return [
        WidgetBackendRecord(
            name="cog", aliases=("cg",), summary="toothed", factory="acme_cogs:Cog", options_model=CogOptions
        )
    ]


@hookimpl
def rallypoint_gadget_makers() -> list[GadgetMakerRecord]:
    return [GadgetMakerRecord(name="lathe", factory="acme_cogs:Lathe")]


@hookimpl
def rallypoint_inspectors() -> list[InspectorRecord]:
    return [InspectorRecord(name="loupe", factory="acme_cogs:Loupe")]
