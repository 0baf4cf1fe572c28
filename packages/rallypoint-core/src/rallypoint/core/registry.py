"""Plugin kinds and the generic, typed registries built from their registration hooks.

A :class:`PluginKind` names one registration hook (``rallypoint_<subsystem>_<things>``), how users
refer to what it registers, the record class its implementations return and, for kinds selected in
the job file, the config key that selects one. Kinds are declared by the packages that own them,
through the ``rallypoint_plugin_kinds`` hook; core knows none of them in advance.

:class:`Registry` holds one kind's records by normalised name (aliases included) and refuses
duplicates, naming both providing distributions; the plugin manager builds it from every
implementation of the kind's hook (:meth:`rallypoint.core.plugins.RallypointPluginManager.registry`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from rallypoint.core.errors import PluginConflictError, PluginError, UnknownPluginError
from rallypoint.core.records import BackendRecord, PluginRecord, normalize_name

__all__ = [
    "Entry",
    "PluginInfo",
    "PluginKind",
    "Registry",
    "SpecialValue",
]

R = TypeVar("R", bound=PluginRecord)

_HOOK_RE = re.compile(r"^rallypoint_[a-z0-9_]+$")
_CONFIG_KEY_RE = re.compile(r"^[a-z][a-z0-9]*\.[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class SpecialValue:
    """A value of a selector key that is not a plugin name, e.g. ``"auto"`` or ``"off"``.

    Attributes:
        value: the value as written in the job file.
        meaning: what it means, for people: ``"disabled"``, ``"picked at run time"``.
        needs_plugin: the value still needs at least one plugin of the kind to be installed
            (``"auto"`` picks among them); resolution fails, with the kind's install hint, when
            none is.
    """

    value: str
    meaning: str
    needs_plugin: bool = False


@dataclass(frozen=True, kw_only=True)
class PluginKind(Generic[R]):
    """One kind of registrable thing, declared by the package that owns it.

    Attributes:
        hook: the registration hook's name, e.g. ``"rallypoint_widget_backends"``. The
            declaring package also adds its specification (``rallypoint_addhooks``).
        label: how messages call one of them, e.g. ``"widget backend"``.
        record_class: the record class implementations must return (a :class:`PluginRecord`
            subclass); a registry of this kind holds records of exactly this type.
        config_key: where the job file selects one, ``"<section>.<key>"`` (e.g.
            ``"widgets.backend"``); the section's ``options`` table is validated against the
            selected record's ``options_model``, so such a kind's records are
            :class:`~rallypoint.core.records.BackendRecord` subclasses. ``None`` for kinds not
            selected in the job file.
        special: values of the config key that are not plugin names.
        install_hint: what to tell users who have none of this kind installed, e.g.
            ``"pip install <a package providing one>"``.

    Example:
        >>> from rallypoint.core.records import BackendRecord
        >>> kind = PluginKind(hook="rallypoint_widgets", label="widget", record_class=BackendRecord,
        ...                   config_key="widgets.kind", special=(SpecialValue("off", "disabled"),))
        >>> kind.section, kind.key, kind.special_value("off").meaning
        ('widgets', 'kind', 'disabled')
    """

    hook: str
    label: str
    record_class: type[R]
    config_key: str | None = None
    special: tuple[SpecialValue, ...] = ()
    install_hint: str = ""

    def __post_init__(self) -> None:
        problem = None
        if not _HOOK_RE.match(self.hook):
            problem = f"hook {self.hook!r} must be named rallypoint_<subsystem>_<things>"
        elif not (isinstance(self.record_class, type) and issubclass(self.record_class, PluginRecord)):
            problem = f"record_class {self.record_class!r} is not a PluginRecord subclass"
        elif self.config_key is not None and not _CONFIG_KEY_RE.match(self.config_key):
            problem = f"config_key {self.config_key!r} must be '<section>.<key>', e.g. 'widgets.backend'"
        elif self.config_key is not None and not issubclass(self.record_class, BackendRecord):
            problem = "a kind selected in the job file (config_key) needs BackendRecord records"
        elif self.special and self.config_key is None:
            problem = "special values need a config_key"
        if problem:
            raise PluginError(f"invalid plugin kind {self.label!r}: {problem}")

    @property
    def section(self) -> str | None:
        """The job-file section of :attr:`config_key` (``"widgets"``), if any."""
        return self.config_key.partition(".")[0] if self.config_key else None

    @property
    def key(self) -> str | None:
        """The key within the section (``"backend"``), if any."""
        return self.config_key.partition(".")[2] if self.config_key else None

    def special_value(self, value: str) -> SpecialValue | None:
        """The :class:`SpecialValue` written ``value``, or ``None`` for a plugin name."""
        return next((s for s in self.special if s.value == value), None)


@dataclass(frozen=True)
class PluginInfo:
    """Where a registered plugin comes from.

    Attributes:
        name: the plugin's name in the manager (its entry-point name).
        distribution: the distribution that installed it, e.g. ``"acme-widgets"``;
            ``None`` for a plugin registered directly from code.
        version: that distribution's version, if known.
        essential: whether it is core's own plugin or comes from the ``rallypoint.essential``
            entry-point group (loaded even with autoload off).
    """

    name: str
    distribution: str | None
    version: str | None
    essential: bool = False

    def describe(self) -> str:
        """``"name (distribution version)"``, the way error messages name a plugin."""
        if self.distribution:
            return f"{self.name} ({self.distribution} {self.version or '?'})".replace(" ?)", ")")
        return self.name


@dataclass(frozen=True)
class Entry(Generic[R]):
    """A record and the plugin that registered it."""

    record: R
    provider: PluginInfo


class Registry(Generic[R]):
    """The records of one kind, by normalised name.

    Built by the plugin manager, ``pm.registry(kind)`` (collected once, cached).
    """

    def __init__(
        self, kind: PluginKind[R], entries: list[Entry[R]], *, declared: bool = True, broken: tuple[str, ...] = ()
    ) -> None:
        self.kind = kind
        self.declared = declared
        self.broken = broken
        self._entries = entries
        self._by_name: dict[str, Entry[R]] = {}
        for entry in entries:
            for name in entry.record.names:
                if name in self._by_name:
                    first = self._by_name[name].provider.describe()
                    raise PluginConflictError(kind.label, name, first, entry.provider.describe())
                self._by_name[name] = entry

    def get(self, name: str, *, where: str | None = None) -> R:
        """The record registered as ``name`` (or one of its aliases).

        Args:
            name: the name as the user wrote it.
            where: where the name came from, quoted in the error, e.g.
                ``"widgets.backend in job.toml"``.

        Raises:
            UnknownPluginError: no such name; the message lists what is available and the closest match.
        """
        entry = self._by_name.get(normalize_name(name))
        if entry is None:
            raise UnknownPluginError(self.kind.label, name, self.names(), where=where, broken=self.broken)
        return entry.record

    def entry(self, name: str) -> Entry[R]:
        """The :class:`Entry` for ``name`` (record and provider)."""
        self.get(name)
        return self._by_name[normalize_name(name)]

    def names(self) -> list[str]:
        """Primary names of every record, sorted."""
        return sorted(normalize_name(e.record.name) for e in self._entries)

    def entries(self) -> list[Entry[R]]:
        """Every entry in registration order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and normalize_name(name) in self._by_name

    def __iter__(self) -> Iterator[R]:
        return (e.record for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)
