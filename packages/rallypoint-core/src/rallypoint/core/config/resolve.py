"""Phase 2 of validation: look up every plugin the job selects and validate its options.

The selectors are the config keys of the plugin kinds installed packages declare (a
:class:`~rallypoint.core.registry.PluginKind` with a ``config_key``, e.g.
``"widgets.backend"``). Each selected name is looked up in its kind's registry and the
section's ``options`` table is validated, once, against the selected record's
``options_model``; everything downstream takes the resulting :class:`Selection` as given.
Special values a kind declares (``auto``, ``off``) are not plugin names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from rallypoint.core.config.loader import LoadedConfig
from rallypoint.core.config.messages import DEFAULT_LABEL, issues_from_validation
from rallypoint.core.config.sections import Section
from rallypoint.core.errors import ConfigError, ConfigIssue, PluginError, UnknownPluginError
from rallypoint.core.records import BackendRecord

if TYPE_CHECKING:
    from rallypoint.core.plugins import PluginInfo, RallypointPluginManager
    from rallypoint.core.registry import PluginKind

__all__ = ["ResolvedConfig", "Selection", "resolve_config"]

S = TypeVar("S", bound=Section)


@dataclass(frozen=True)
class Selection:
    """What one selector resolved to.

    Attributes:
        key: the selector's key path, e.g. ``"widgets.backend"``.
        name: the value in the config.
        record: the selected record; ``None`` for a special value (``auto``, ``off``).
        provider: the plugin that registered it.
        options: the selected record's ``options_model`` instance, validated from the section's
            ``options`` table; ``None`` when the record takes no options (or for a special value).
        note: a remark for people (``"picked at run time among: a, b"``).
    """

    key: str
    name: str
    record: BackendRecord | None = None
    provider: PluginInfo | None = None
    options: BaseModel | None = None
    note: str = ""


@dataclass
class ResolvedConfig:
    """A job whose plugin selections have all been found and whose options are valid.

    ``resolved.config.<section>`` is the section as validated in phase 1; typed code uses
    :meth:`section` and :meth:`selection`.
    """

    loaded: LoadedConfig
    selections: dict[str, Selection] = field(default_factory=dict)

    @property
    def config(self) -> Any:
        """The phase-1 job model; each declared section is an attribute."""
        return self.loaded.config

    def section(self, model: type[S]) -> S:
        """The job's section validated by ``model``, typed (see :meth:`LoadedConfig.section`)."""
        return self.loaded.section(model)

    def section_or_none(self, model: type[S]) -> S | None:
        """Like :meth:`section`, but ``None`` for an optional section the job does not have."""
        return self.loaded.section_or_none(model)

    def selection(self, key: str) -> Selection | None:
        """What the selector ``key`` (``"widgets.backend"``) resolved to.

        ``None`` when the job does not use it (an optional section it does not have) or no
        installed kind selects there.
        """
        return self.selections.get(key)


def _options(
    loaded: LoadedConfig, kind: PluginKind[Any], record: BackendRecord, raw: Any, issues: list[ConfigIssue]
) -> BaseModel | None:
    section = kind.section or ""
    options_key = f"{section}.options"
    model = record.options_model
    if model is None:
        if raw:
            names = ", ".join(sorted(raw))
            message = f"{kind.label} {record.name!r} takes no options; remove {names}"
            issues.append(ConfigIssue(loaded.source_of(options_key), options_key, message))
        return None
    selected_by = loaded.source_of(kind.config_key or section)

    def source_of(key: str) -> str:
        # no options were given: a missing one is the doing of whoever selected the plugin
        return loaded.source_of(key) if loaded.is_explicit(options_key) else selected_by

    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        issues.extend(
            issues_from_validation(
                exc, model, prefix=(section, "options"), source_of=source_of, is_explicit=loaded.is_explicit
            )
        )
        return None


def _special(
    kind: PluginKind[Any], key: str, name: str, source: str, pm: RallypointPluginManager, issues: list[ConfigIssue]
) -> Selection | None:
    special = kind.special_value(name)
    assert special is not None
    if not special.needs_plugin:
        return Selection(key, name, note=special.meaning)
    names = pm.registry(kind).names()
    if not names:
        hint = f"; {kind.install_hint}" if kind.install_hint else ""
        message = f"{name!r} needs at least one {kind.label}, and none is installed{hint}"
        issues.append(ConfigIssue(source, key, message))
        return None
    return Selection(key, name, note=f"{special.meaning} among: {', '.join(names)}")


def _selector_source(loaded: LoadedConfig, key: str, section_name: str) -> str:
    """Where the selector was set.

    For a default, whoever set something in its section: that made an optional section present,
    or asked for options of the default plugin.
    """
    source = loaded.source_of(key)
    if source != DEFAULT_LABEL:
        return source
    setters = [src for k, src in loaded.sources.items() if k == section_name or k.startswith(section_name + ".")]
    return setters[-1] if setters else source


def _resolve_one(
    loaded: LoadedConfig, pm: RallypointPluginManager, kind: PluginKind[Any], issues: list[ConfigIssue]
) -> Selection | None:
    key, section_name, field_name = kind.config_key or "", kind.section or "", kind.key or ""
    section = getattr(loaded.config, section_name, None)
    if section is None:  # an optional section that the job does not use
        return None
    name: str = getattr(section, field_name)
    source = _selector_source(loaded, key, section_name)
    if kind.special_value(name) is not None:
        raw_options = getattr(section, "options", None)
        if raw_options:  # they would reach no plugin: say so rather than drop them
            options_key = f"{section_name}.options"
            names = ", ".join(pm.registry(kind).names()) or "none installed"
            message = (
                f"{key} = {name!r} takes no options ({', '.join(sorted(raw_options))} given); "
                f"name a {kind.label} ({names}) in {key} to give it options"
            )
            issues.append(ConfigIssue(loaded.source_of(options_key), options_key, message))
        return _special(kind, key, name, source, pm, issues)
    registry = pm.registry(kind)
    if not registry.declared:
        message = f"{kind.label} {name!r} cannot be found: no installed package declares the hook {kind.hook}"
        issues.append(ConfigIssue(source, key, message))
        return None
    try:
        entry = registry.entry(name)
    except UnknownPluginError as exc:
        failure = pm.failure_named(name)
        message = str(failure.error if failure is not None else exc)
        if failure is None and not registry.names() and kind.install_hint:  # say what to install, not a pattern
            message = f"{kind.label} {name!r} is not installed, and no {kind.label} is; {kind.install_hint}"
        issues.append(ConfigIssue(source, key, message))
        return None
    record: BackendRecord = entry.record
    try:
        record.check_requirements(kind.label)
    except PluginError as exc:
        issues.append(ConfigIssue(source, key, str(exc)))
    options = _options(loaded, kind, record, getattr(section, "options", {}), issues)
    return Selection(key, name, record, entry.provider, options)


def resolve_config(loaded: LoadedConfig, pm: RallypointPluginManager) -> ResolvedConfig:
    """Resolve every plugin selection of ``loaded`` against the plugins in ``pm``.

    The selectors are the ``config_key`` of every kind ``pm`` knows whose section the job's
    schema has, in declaration order.

    Raises:
        ConfigError: with every issue found: unknown names (with suggestions), plugins that
            failed to load, missing dependencies and invalid ``options`` values.
    """
    issues: list[ConfigIssue] = []
    resolved = ResolvedConfig(loaded)
    for kind in pm.kinds():
        if kind.section is None or loaded.schema.get(kind.section) is None:
            continue
        selection = _resolve_one(loaded, pm, kind, issues)
        if selection is not None:
            resolved.selections[selection.key] = selection
    if issues:
        raise ConfigError(issues)
    return resolved
