"""The plugin manager: pluggy's, plus where each plugin came from and what the installed packages declare.

:class:`RallypointPluginManager` keeps each plugin's provenance (:class:`~rallypoint.core.registry.PluginInfo`)
and its load failures (:class:`LoadFailure`), and collects, once every plugin is registered, the
plugin kinds, the job-file sections and each kind's registry. It does not load anything itself:
:func:`rallypoint.core.plugins.get_plugin_manager` builds and fills one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

import pluggy

from rallypoint.core.errors import PluginConflictError, PluginError, PluginLoadError
from rallypoint.core.markers import PROJECT_NAME
from rallypoint.core.registry import Entry, PluginInfo, PluginKind, Registry

if TYPE_CHECKING:
    from rallypoint.core.config.sections import ConfigSection, JobSchema
    from rallypoint.core.records import PluginRecord

    R = TypeVar("R", bound=PluginRecord)

T = TypeVar("T")

__all__ = ["DISABLE_PLUGINS_ENV", "LoadFailure", "PluginLoadWarning", "RallypointPluginManager"]

#: Comma-separated names of plugins never registered.
DISABLE_PLUGINS_ENV = "RALLYPOINT_DISABLE_PLUGINS"


class PluginLoadWarning(UserWarning):
    """A plugin failed to load; everything that does not need it keeps working."""


@dataclass(frozen=True)
class LoadFailure:
    """A plugin that could not be loaded, kept so that selecting it explains why it is missing.

    Attributes:
        info: the plugin.
        error: why it could not be loaded.
        provides: the record names it would have registered, where they could be learnt (a
            plugin with a misspelled hook): a job selecting one of them gets ``error``.
    """

    info: PluginInfo
    error: PluginError
    provides: frozenset[str] = frozenset()


class RallypointPluginManager(pluggy.PluginManager):
    """A :class:`pluggy.PluginManager` that remembers where each plugin came from.

    It also collects what the installed packages declare: plugin kinds (:meth:`kinds`), job-file
    sections (:meth:`sections`, :meth:`job_schema`) and each kind's registry (:meth:`registry`).
    Each is collected on first use, after every plugin is registered, and cached until the next
    registration. Use :func:`get_plugin_manager` to build one.
    """

    def __init__(self) -> None:
        super().__init__(PROJECT_NAME)
        self.infos: dict[str, PluginInfo] = {}
        self.load_failures: list[LoadFailure] = []
        self.disabled: frozenset[str] = frozenset()
        #: names of every essential plugin found installed (core's own included)
        self.essential_names: list[str] = []
        self._cache: dict[Hashable, Any] = {}
        #: which plugin declared what: ``"plugin kind <hook>"``, ``"config key <key>"`` and
        #: ``"config section <name>"`` to the plugin's name
        self.declared_by: dict[str, str] = {}
        #: plugins registered from the ``rallypoint`` entry-point group (third-party ones included)
        self.from_entry_points: set[str] = set()

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin`` (see :meth:`pluggy.PluginManager.register`); forgets cached declarations."""
        self._cache.clear()
        return super().register(plugin, name)

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any | None:
        """Unregister a plugin; forgets cached declarations."""
        self._cache.clear()
        return super().unregister(plugin, name)

    def register_plugin(self, plugin: object, info: PluginInfo) -> None:
        """Register ``plugin`` under ``info.name`` and remember its provenance."""
        self.register(plugin, name=info.name)
        self.infos[info.name] = info

    def info_for(self, plugin: object) -> PluginInfo:
        """Provenance of a registered plugin object."""
        name = self.get_name(plugin) or repr(plugin)
        return self.infos.get(name) or PluginInfo(name=name, distribution=None, version=None)

    def _cached(self, key: Hashable, build: Callable[[], T]) -> T:
        if key not in self._cache:
            self._cache[key] = build()
        value: T = self._cache[key]
        return value

    def kinds(self) -> tuple[PluginKind[Any], ...]:
        """Every plugin kind the registered packages declare, in registration order.

        A plugin whose ``rallypoint_plugin_kinds`` raises or returns something else than
        :class:`~rallypoint.core.registry.PluginKind` objects, or declares a hook or config key
        another plugin declared first, is a load failure (a warning) and declares nothing.
        """

        def keys(kind: PluginKind[Any]) -> list[tuple[str, str]]:
            return [("plugin kind", kind.hook)] + ([("config key", kind.config_key)] if kind.config_key else [])

        return self._cached("kinds", lambda: tuple(self._declarations("rallypoint_plugin_kinds", PluginKind, keys)))

    def kind(self, hook: str) -> PluginKind[Any]:
        """The declared kind whose registration hook is ``hook``.

        Raises:
            PluginError: no registered package declares it.
        """
        for kind in self.kinds():
            if kind.hook == hook:
                return kind
        declared = ", ".join(k.hook for k in self.kinds()) or "none"
        raise PluginError(
            f"no installed package declares the plugin kind {hook!r} (declared: {declared}); "
            "see rallypoint plugins list"
        )

    def sections(self) -> tuple[ConfigSection, ...]:
        """Every job-file section the registered packages declare, in registration order.

        A plugin declaring a section another plugin declared first is a load failure.
        """
        from rallypoint.core.config.sections import ConfigSection

        def keys(section: ConfigSection) -> list[tuple[str, str]]:
            return [("config section", section.name)]

        return self._cached(
            "sections", lambda: tuple(self._declarations("rallypoint_config_sections", ConfigSection, keys))
        )

    def job_schema(self) -> JobSchema:
        """The schema of a job file made of :meth:`sections` (built once per set of sections)."""
        from rallypoint.core.config.sections import build_schema

        return build_schema(self.sections())

    @overload
    def registry(self, kind: PluginKind[R]) -> Registry[R]: ...

    @overload
    def registry(self, kind: str) -> Registry[Any]: ...

    def registry(self, kind: PluginKind[Any] | str) -> Registry[Any]:
        """The registry of ``kind``: a kind object, or the name of a declared kind's hook.

        Collected once per manager (and again after a registration). A kind object that no
        registered package declares (its package is disabled) gives an empty registry whose
        ``declared`` is false.

        Raises:
            PluginError: ``kind`` is a hook name that no registered package declares.
            PluginConflictError: two plugins registered the same name of this kind.
        """
        if isinstance(kind, str):
            kind = self.kind(kind)
        found = kind
        return self._cached(("registry", kind), lambda: self._collect(found))

    def _collect(self, kind: PluginKind[R]) -> Registry[R]:
        """Call every implementation of ``kind.hook`` and build its registry.

        A plugin whose hook raises, or returns something that is not a ``kind.record_class``, is
        reported as a load failure (a warning) and contributes nothing.

        Raises:
            PluginConflictError: two plugins registered the same name or alias.
        """
        broken = tuple(f.info.name for f in self.load_failures)
        caller = getattr(self.hook, kind.hook, None)
        if caller is None or not caller.has_spec():
            return Registry(kind, [], declared=False, broken=broken)
        entries: list[Entry[R]] = []
        expected = kind.record_class
        # get_hookimpls() lists implementations in registration order (pluggy *calls* them in
        # reverse); keep that order so that "first" and "second" in conflicts mean what they say.
        for impl in caller.get_hookimpls():
            info = self.info_for(impl.plugin)
            try:
                result = impl.function()
                records = list(result or ())
                for record in records:
                    if not isinstance(record, expected):
                        raise PluginError(f"{kind.hook} returned {record!r}; expected {expected.__name__} records")
            except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the others
                self._fail(info, PluginLoadError(info.name, info.describe(), exc))
                continue
            entries.extend(Entry(record, info) for record in records)
        return Registry(kind, entries, broken=tuple(f.info.name for f in self.load_failures))

    def _declarations(self, hook: str, expected: type[T], keys: Callable[[T], list[tuple[str, str]]]) -> list[T]:
        caller = getattr(self.hook, hook, None)
        if caller is None:
            return []
        out: list[T] = []
        owners: dict[tuple[str, str], PluginInfo] = {}
        for impl in caller.get_hookimpls():  # registration order
            info = self.info_for(impl.plugin)
            try:
                items = list(impl.function() or ())
                mine: dict[tuple[str, str], PluginInfo] = {}
                for item in items:
                    if not isinstance(item, expected):
                        raise PluginError(f"{hook} returned {item!r}; expected {expected.__name__} objects")
                    for key in keys(item):
                        first = owners.get(key) or mine.get(key)
                        if first is not None:
                            raise PluginConflictError(key[0], key[1], first.describe(), info.describe())
                        mine[key] = info
            except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the others
                self._fail(info, exc)
                continue
            owners.update(mine)
            self.declared_by.update({f"{what} {name}": info.name for what, name in mine})
            out.extend(items)
        return out

    def failure_named(self, name: str) -> LoadFailure | None:
        """Why ``name`` is missing: the load failure of the plugin called so or known to provide it.

        A plugin disabled with ``RALLYPOINT_DISABLE_PLUGINS`` whose name is ``name`` is reported
        as disabled (not as missing).
        """
        from rallypoint.core.records import normalize_name

        wanted = normalize_name(name)
        for failure in self.load_failures:
            if normalize_name(failure.info.name) == wanted or wanted in failure.provides:
                return failure
        disabled = next((d for d in self.disabled if normalize_name(d) == wanted), None)
        if disabled is not None:
            error = PluginError(
                f"{name!r} is provided by the plugin {disabled!r}, which is disabled by "
                f"{DISABLE_PLUGINS_ENV}; remove {disabled} from that variable to use it"
            )
            return LoadFailure(PluginInfo(disabled, None, None), error)
        return None

    def _fail(self, info: PluginInfo, exc: BaseException) -> None:
        error = (
            exc
            if isinstance(exc, PluginLoadError)
            else PluginLoadError(
                info.name, f"{info.distribution or 'unknown distribution'} {info.version or ''}".strip(), exc
            )
        )
        self.load_failures.append(LoadFailure(info, error))
        warnings.warn(str(error), PluginLoadWarning, stacklevel=3)
