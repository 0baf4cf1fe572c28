"""The JSON Schema of a job file, for editors (``rallypoint config schema``).

Built from what the installed packages declare: every section's model, and for each plugin
selector (a kind's ``config_key``, such as ``rendezvous.backend``) the names it accepts and, chosen
by the selector's value, the options model of each installed plugin.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from rallypoint.core.plugins import RallypointPluginManager

__all__ = ["job_json_schema"]

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's schema with its definitions inlined under ``$defs`` of its own (self-contained)."""
    schema = model.model_json_schema(mode="validation")
    return json.loads(json.dumps(schema))  # type: ignore[no-any-return]


def _selector(pm: RallypointPluginManager, kind: Any, section: dict[str, Any]) -> None:
    """Names for the selector key, and options per selected plugin (``if``/``then``).

    A section that leaves the selector out selects its default plugin (the selector's
    ``default``), whose options then apply too.
    """
    from rallypoint.core.errors import PluginError

    try:
        registry = pm.registry(kind)
    except PluginError:  # a conflict: the schema keeps the generic options table
        return
    names = [*(special.value for special in kind.special), *registry.names()]
    props = section.setdefault("properties", {})
    selector = props.setdefault(kind.key, {})
    selector["examples"] = names
    # `config check` accepts the installed plugins' names and aliases only
    selector["enum"] = [*names, *(alias for record in registry for alias in record.aliases)]
    selector.setdefault("description", f"the {kind.label}: {', '.join(names) or 'none installed'}")
    default = selector.get("default")
    branches = []
    for record in registry:
        chosen: dict[str, Any] = {
            "properties": {kind.key: {"enum": [record.name, *record.aliases]}},
            "required": [kind.key],
        }
        if default in (record.name, *record.aliases):
            chosen = {"anyOf": [chosen, {"not": {"required": [kind.key]}}]}
        if record.options_model is None:  # `config check` refuses options for it
            options: dict[str, Any] = {"type": "object", "maxProperties": 0}
        else:
            options = _model_schema(record.options_model)
        then: dict[str, Any] = {"properties": {"options": options}}
        if options.get("required"):  # the plugin cannot do without its options table
            then["required"] = ["options"]
        branches.append({"if": chosen, "then": then})
    if branches:
        section.setdefault("allOf", []).extend(branches)


def job_json_schema(pm: RallypointPluginManager) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a job file with the installed packages and plugins.

    Example:
        >>> from rallypoint.core.plugins import get_plugin_manager
        >>> schema = job_json_schema(get_plugin_manager(autoload=False))
        >>> schema["type"], schema["additionalProperties"]
        ('object', False)
    """
    properties: dict[str, Any] = {}
    for declared in pm.sections():
        section = _model_schema(declared.model)
        section.setdefault("description", declared.summary)
        properties[declared.name] = section
    for kind in pm.kinds():
        if kind.config_key and kind.section in properties:
            _selector(pm, kind, properties[kind.section])
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "rallypoint job file",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
