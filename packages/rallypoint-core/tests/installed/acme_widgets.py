"""acme-widgets 1.0: a made-up subsystem, installed for core's tests the way a real one is.

It is an essential package (entry point ``widgets`` in the ``rallypoint.essential`` group, see
``acme_widgets-1.0.dist-info``) that does what every rallypoint subsystem does, and nothing
more: it adds hook specifications, declares plugin kinds and job-file sections, declares what
``rallypoint plugin new widget-backend`` writes (templates in ``acme_widget_templates``), and
registers one plugin of its own kind (the ``plain`` widget backend). Core knows none of these names.

Kinds:
    ``widget backend`` (``widgets.backend``), ``gadget maker`` (``gadgets.maker``; ``"auto"``
    picks one at run time and needs one installed), ``inspector`` (``inspection.inspector``;
    ``"off"`` disables it), ``courier`` (``delivery.courier``, in the optional ``[delivery]``
    section) and ``widget part`` (no config key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pluggy
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from rallypoint.core.authoring.kinds import TemplateKind
from rallypoint.core.config import ConfigSection, Duration, PositiveDuration, Section
from rallypoint.core.plugins import hookimpl, hookspec
from rallypoint.core.records import BackendRecord, PluginRecord
from rallypoint.core.registry import PluginKind, SpecialValue

# ---------------------------------------------------------------------------------------------
# Records and kinds


@dataclass(frozen=True, kw_only=True)
class WidgetBackendRecord(BackendRecord):
    """A widget backend, selected with ``[widgets] backend = "<name>"``."""

    teeth: int = 12


@dataclass(frozen=True, kw_only=True)
class GadgetMakerRecord(BackendRecord):
    """A gadget maker, selected with ``[gadgets] maker = "<name>"`` (or ``"auto"``)."""


@dataclass(frozen=True, kw_only=True)
class InspectorRecord(BackendRecord):
    """An inspector, selected with ``[inspection] inspector = "<name>"`` (or ``"off"``)."""


@dataclass(frozen=True, kw_only=True)
class CourierRecord(BackendRecord):
    """A courier, selected with ``[delivery] courier = "<name>"`` in jobs that have ``[delivery]``."""


@dataclass(frozen=True, kw_only=True)
class WidgetPartRecord(PluginRecord):
    """A widget part: registered, listed, never selected in the job file."""


WIDGET_BACKENDS = PluginKind(
    hook="rallypoint_widget_backends",
    label="widget backend",
    record_class=WidgetBackendRecord,
    config_key="widgets.backend",
)
GADGET_MAKERS = PluginKind(
    hook="rallypoint_gadget_makers",
    label="gadget maker",
    record_class=GadgetMakerRecord,
    config_key="gadgets.maker",
    special=(SpecialValue("auto", "picked at run time", needs_plugin=True),),
    install_hint="pip install acme-cogs",
)
INSPECTORS = PluginKind(
    hook="rallypoint_inspectors",
    label="inspector",
    record_class=InspectorRecord,
    config_key="inspection.inspector",
    special=(SpecialValue("off", "disabled"),),
)
COURIERS = PluginKind(
    hook="rallypoint_couriers", label="courier", record_class=CourierRecord, config_key="delivery.courier"
)
WIDGET_PARTS = PluginKind(hook="rallypoint_widget_parts", label="widget part", record_class=WidgetPartRecord)

KINDS = (WIDGET_BACKENDS, GADGET_MAKERS, INSPECTORS, COURIERS, WIDGET_PARTS)

# ---------------------------------------------------------------------------------------------
# Job-file sections


class WidgetsSection(Section):
    """``[widgets]``: how many widgets, made by which backend."""

    name: str | None = None
    backend: str = "plain"
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1)
    tags: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    join_timeout: PositiveDuration = 600.0
    grace: Duration = 5.0
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _range(self) -> WidgetsSection:
        if self.max is not None and self.max < self.min:
            raise PydanticCustomError(
                "widgets_range", "max ({max}) is smaller than min ({min})", {"max": self.max, "min": self.min}
            )
        return self


class GadgetsSection(Section):
    """``[gadgets]``: the gadget maker."""

    maker: str = "auto"
    timeout: PositiveDuration = 600.0
    options: dict[str, Any] = Field(default_factory=dict)


class InspectionSection(Section):
    """``[inspection]``: the inspector, off by default."""

    inspector: str = "off"
    verbose: bool = False
    options: dict[str, Any] = Field(default_factory=dict)


class DeliverySection(Section):
    """``[delivery]``: only in jobs that deliver."""

    courier: str = "pigeon"
    mode: Literal["safe", "fast"] = "safe"
    options: dict[str, Any] = Field(default_factory=dict)


SECTIONS = (
    ConfigSection("widgets", WidgetsSection, "how many widgets, made by which backend"),
    ConfigSection("gadgets", GadgetsSection, "the gadget maker"),
    ConfigSection("inspection", InspectionSection, "the inspector"),
    ConfigSection("delivery", DeliverySection, "deliveries", optional=True),
)

# ---------------------------------------------------------------------------------------------
# Hook specifications and implementations


class Hookspecs:
    """The hooks of the widgets subsystem."""

    @hookspec
    def rallypoint_widget_backends(self) -> list[WidgetBackendRecord]:
        """Register widget backends."""

    @hookspec
    def rallypoint_gadget_makers(self) -> list[GadgetMakerRecord]:
        """Register gadget makers."""

    @hookspec
    def rallypoint_inspectors(self) -> list[InspectorRecord]:
        """Register inspectors."""

    @hookspec
    def rallypoint_couriers(self) -> list[CourierRecord]:
        """Register couriers."""

    @hookspec
    def rallypoint_widget_parts(self) -> list[WidgetPartRecord]:
        """Register widget parts."""

    @hookspec
    def rallypoint_widget_made(self, widget: str) -> None:
        """A widget was made (a lifecycle hook)."""


@hookimpl
def rallypoint_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    pluginmanager.add_hookspecs(Hookspecs)


@hookimpl
def rallypoint_plugin_kinds() -> tuple[PluginKind[Any], ...]:
    return KINDS


@hookimpl
def rallypoint_config_sections() -> tuple[ConfigSection, ...]:
    return SECTIONS


#: What ``rallypoint plugin new widget-backend NAME`` writes (templates in ``acme_widget_templates``).
WIDGET_BACKEND_TEMPLATE = TemplateKind(
    name="widget-backend",
    summary="a widget backend: how widgets are made",
    hook="rallypoint_widget_backends",
    requires=("acme-widgets",),
    testing=("acme-widgets",),
    templates="acme_widget_templates:widget-backend",
    impl="backend",
    expected=("0=__NAME__", "1=__NAME__"),
    selects="widgets.backend",
    conformance_kit="acme_widgets",
)


@hookimpl
def rallypoint_plugin_templates() -> list[TemplateKind]:
    return [WIDGET_BACKEND_TEMPLATE]


@hookimpl
def rallypoint_widget_backends() -> list[WidgetBackendRecord]:
    return [WidgetBackendRecord(name="plain", summary="widgets without options", factory="acme_widgets:Plain")]


class CogOptions(BaseModel):
    """``[widgets.options]`` of the ``cog`` widget backend (registered by acme-cogs)."""

    model_config = ConfigDict(extra="forbid")
    endpoints: list[str]
    retries: int = Field(default=3, ge=0)
    timeout: Duration = 5.0
