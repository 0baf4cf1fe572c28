"""Phase 2 of validation: look up every plugin the job selects and validate its options.

Selectors: ``rendezvous.backend``, ``ranks.strategy``, ``collectives.backend`` (``auto`` picks at
run time among the installed ones), ``timer.watchdog`` (``off`` disables it) and, in jobs with an
``[rpc]`` section, ``rpc.transport``. Each name is looked up in its registry and the section's
``options`` table is validated against the selected record's ``options_model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from rallypoint.core.config.loader import LoadedConfig, issues_from_validation
from rallypoint.core.errors import ConfigError, ConfigIssue, PluginError, UnknownPluginError
from rallypoint.core.plugins import PluginInfo, RallypointPluginManager
from rallypoint.core.records import BackendRecord
from rallypoint.core.registry import (
    COLLECTIVE_BACKENDS,
    RANK_STRATEGIES,
    RENDEZVOUS_BACKENDS,
    RPC_TRANSPORTS,
    TIMER_BACKENDS,
    PluginKind,
)

__all__ = ["Selection", "ResolvedConfig", "resolve_config", "SELECTORS"]


@dataclass(frozen=True)
class Selector:
    """A key of the job file that names a plugin."""

    section: str
    key: str
    kind: PluginKind
    #: values that are not plugin names (``auto``, ``off``) and what they mean
    special: tuple[str, ...] = ()


SELECTORS: tuple[Selector, ...] = (
    Selector("rendezvous", "backend", RENDEZVOUS_BACKENDS),
    Selector("ranks", "strategy", RANK_STRATEGIES),
    Selector("collectives", "backend", COLLECTIVE_BACKENDS, special=("auto",)),
    Selector("timer", "watchdog", TIMER_BACKENDS, special=("off",)),
    Selector("rpc", "transport", RPC_TRANSPORTS),
)


@dataclass(frozen=True)
class Selection:
    """What one selector resolved to.

    Attributes:
        key: the selector's key path, e.g. ``"rendezvous.backend"``.
        name: the value in the config.
        record: the selected record; ``None`` for a special value (``auto``, ``off``) or when the
            subsystem is not installed and the default was not changed.
        provider: the plugin that registered it.
        options: the validated options model instance, if the record has an options model.
        note: a remark for people (``"picked at run time among: gloo, nccl"``).
    """

    key: str
    name: str
    record: BackendRecord | None = None
    provider: PluginInfo | None = None
    options: BaseModel | None = None
    note: str = ""


@dataclass
class ResolvedConfig:
    """A job whose plugin selections have all been found and whose options are valid."""

    loaded: LoadedConfig
    selections: dict[str, Selection] = field(default_factory=dict)

    @property
    def config(self) -> Any:
        """The phase-1 :class:`~rallypoint.core.config.models.JobConfig`."""
        return self.loaded.config


def _resolve_one(
    loaded: LoadedConfig, pm: RallypointPluginManager, sel: Selector, issues: list[ConfigIssue]
) -> Selection | None:
    section = getattr(loaded.config, sel.section)
    if section is None:  # an optional section that the job does not use
        return None
    key = f"{sel.section}.{sel.key}"
    name: str = getattr(section, sel.key)
    source = loaded.source_of(key)
    registry = pm.registry(sel.kind)
    explicit = loaded.is_explicit(key) or loaded.is_explicit(f"{sel.section}.options")
    if name in sel.special:
        if name == "auto":
            if not registry.declared and not explicit:  # the default, and the subsystem is absent
                return Selection(key, name, note=f"{sel.kind.distribution} not installed")
            if not registry.names():
                issues.append(
                    ConfigIssue(
                        source,
                        key,
                        (
                            f"'auto' needs at least one {sel.kind.label}, and none is installed; "
                            f"pip install rallypoint-gloo"
                        ),
                    )
                )
                return None
            return Selection(key, name, note=f"picked at run time among: {', '.join(registry.names())}")
        return Selection(key, name, note="disabled")
    if not registry.declared:
        if explicit:
            issues.append(
                ConfigIssue(
                    source,
                    key,
                    (
                        f"{sel.kind.label} {name!r} needs {sel.kind.distribution}, which is not installed; "
                        f"pip install {sel.kind.distribution}"
                    ),
                )
            )
        return Selection(key, name, note=f"{sel.kind.distribution} not installed")
    try:
        entry = registry.entry(name)
    except UnknownPluginError as exc:
        failure = pm.failure_named(name)
        if failure is not None:
            issues.append(ConfigIssue(source, key, str(failure.error)))
        else:
            issues.append(ConfigIssue(source, key, str(exc)))
        return None
    record = entry.record
    try:
        record.check_requirements(sel.kind.label)
    except PluginError as exc:
        issues.append(ConfigIssue(source, key, str(exc)))
    options_key = f"{sel.section}.options"
    raw_options = getattr(section, "options", {})
    options: BaseModel | None = None
    if record.options_model is None:
        if raw_options:
            issues.append(
                ConfigIssue(
                    loaded.source_of(options_key),
                    options_key,
                    (f"{sel.kind.label} {record.name!r} takes no options; remove {', '.join(sorted(raw_options))}"),
                )
            )
    else:
        try:
            options = record.options_model.model_validate(raw_options)
        except ValidationError as exc:
            issues.extend(
                issues_from_validation(
                    exc, record.options_model, prefix=(sel.section, "options"), source_of=loaded.source_of
                )
            )
    return Selection(key, name, record, entry.provider, options)


def resolve_config(loaded: LoadedConfig, pm: RallypointPluginManager) -> ResolvedConfig:
    """Resolve every plugin selection of ``loaded`` against the plugins in ``pm``.

    Raises:
        ConfigError: with every issue found: unknown names (with suggestions), plugins that
            failed to load, missing dependencies and invalid ``options`` values.
    """
    issues: list[ConfigIssue] = []
    resolved = ResolvedConfig(loaded)
    for sel in SELECTORS:
        selection = _resolve_one(loaded, pm, sel, issues)
        if selection is not None:
            resolved.selections[selection.key] = selection
    if issues:
        raise ConfigError(issues)
    return resolved
