"""Printing a resolved job back as TOML, annotated with where each value came from."""

from __future__ import annotations

import json
import re
from typing import Any

from rallypoint.core.config.resolve import ResolvedConfig

__all__ = ["render_resolved", "resolved_as_dict", "resolved_sources", "section_env", "toml_value"]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_value(value: Any) -> str:
    """Format a Python value as a TOML value.

    >>> toml_value(["a", 1, True]), toml_value({"x": 2.5})
    ('["a", 1, true]', '{ x = 2.5 }')
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value))


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def resolved_as_dict(resolved: ResolvedConfig) -> dict[str, Any]:
    """The resolved job as plain data (durations in human form), plus each plugin selection."""
    data: dict[str, Any] = resolved.config.model_dump(mode="json", exclude_none=True)
    for key, sel in resolved.selections.items():
        section = key.split(".")[0]
        if sel.options is not None:
            data[section]["options"] = sel.options.model_dump(mode="json", exclude_none=True)
    data["plugins"] = {
        key: {
            "name": sel.name,
            "provider": sel.provider.describe() if sel.provider else None,
            "note": sel.note or None,
        }
        for key, sel in resolved.selections.items()
    }
    return data


def section_env(resolved: ResolvedConfig, name: str) -> dict[str, str]:
    """Section ``name`` of the resolved job as ``RALLYPOINT_<NAME>_<KEY>`` overrides (TOML values).

    Every key is written, defaults included, and ``options`` as the selected plugin's validated
    options (``None`` values are left out: TOML has none). Loading a job with these variables as
    its environment (``load_job_config(None, schema, environ=...)``) gives back the same
    section: it is how a package hands its section to the workers (``ConfigSection.worker_env``).
    ``{}`` for an optional section the job does not have.

    >>> from rallypoint.core.config import load_job_config, resolve_config, build_schema, ConfigSection, Section
    >>> class WidgetSection(Section):
    ...     count: int = 1
    ...     names: list[str] = []
    >>> schema = build_schema([ConfigSection("widgets", WidgetSection)])
    >>> loaded = load_job_config(None, schema, overrides=[("widgets.names", ["a"], "--set")], environ={})
    >>> section_env(ResolvedConfig(loaded), "widgets")
    {'RALLYPOINT_WIDGETS_COUNT': '1', 'RALLYPOINT_WIDGETS_NAMES': '["a"]'}
    """
    section = getattr(resolved.config, name, None)
    if section is None:
        return {}
    values: dict[str, Any] = section.model_dump(mode="json", exclude_none=True)
    for key, sel in resolved.selections.items():
        if key.split(".")[0] == name and sel.options is not None:
            values["options"] = sel.options.model_dump(mode="json", exclude_none=True)
    return {f"RALLYPOINT_{name.upper()}_{key.upper()}": toml_value(value) for key, value in values.items()}


def resolved_sources(resolved: ResolvedConfig) -> dict[str, str]:
    """Every value's key path and where it was set (``default`` when nowhere)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value and (prefix.count(".") < 1 or prefix.endswith(".options")):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        else:
            out[prefix] = resolved.loaded.source_of(prefix, inherit=False)

    data = resolved_as_dict(resolved)
    data.pop("plugins", None)
    for section, values in data.items():
        walk(section, values)
    return out


def render_resolved(resolved: ResolvedConfig) -> str:
    """The resolved job as TOML; each value is followed by where it was set (or ``default``)."""
    data = resolved_as_dict(resolved)
    plugins = data.pop("plugins")
    lines: list[str] = []
    loaded = resolved.loaded
    for section, values in data.items():
        if lines:
            lines.append("")
        lines.append(f"[{section}]")
        tables = []
        for key, value in values.items():
            path = f"{section}.{key}"
            if isinstance(value, dict) and key == "options":
                tables.append((path, value))
                continue
            comment = loaded.source_of(path, inherit=False)
            sel = plugins.get(path)
            if sel:
                comment += f"; {sel['provider'] or sel['note']}"
                if sel["provider"] and sel["note"]:
                    comment += f" ({sel['note']})"
            lines.append(f"{_key(key)} = {toml_value(value)}  # {comment}")
        for path, table in tables:
            if not table:
                continue
            lines.append(f"[{path}]")
            for key, value in table.items():
                lines.append(
                    f"{_key(key)} = {toml_value(value)}  # {loaded.source_of(path + '.' + key, inherit=False)}"
                )
    if not lines:
        lines.append("# no sections: no installed package declares one (see rallypoint plugins list)")
    return "\n".join(lines) + "\n"
