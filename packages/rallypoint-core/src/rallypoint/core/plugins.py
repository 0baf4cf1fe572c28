"""The rallypoint plugin system.

One pluggy project, ``rallypoint``: use :data:`hookimpl` to implement hooks and :data:`hookspec`
to declare them. :func:`get_plugin_manager` builds a manager on demand (there is no module-level
manager): it registers core's own plugin, the *essential* packages (entry-point group
``rallypoint.essential``), the plugins advertised in the ``rallypoint`` entry-point group, and
checks that every implemented hook has a specification, so a misspelled hook name is an error
rather than silently ignored.

Core knows no subsystem: the framework's packages register like any plugin, through entry
points. Those the framework cannot work without (the packages that declare hook specifications,
plugin kinds and job-file sections) advertise theirs in ``rallypoint.essential``; those are
loaded even when autoload is off. Each package then declares its plugin kinds
(``rallypoint_plugin_kinds``) and its sections of the job file (``rallypoint_config_sections``);
the manager collects both once every plugin is registered, and caches them.

Environment controls:

``RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD``
    When set to a non-empty value other than ``0``, the ``rallypoint`` entry points are not
    loaded; core and the essential packages (and plugins passed explicitly) still are.
``RALLYPOINT_DISABLE_PLUGINS``
    Comma-separated plugin names (entry-point names, essential ones included) that are never
    registered.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, overload

import pluggy

from rallypoint.core.errors import PluginConflictError, PluginError, PluginLoadError
from rallypoint.core.markers import PROJECT_NAME, hookimpl, hookspec
from rallypoint.core.registry import Entry, PluginInfo, PluginKind, Registry

if TYPE_CHECKING:
    from rallypoint.core.config.sections import ConfigSection, JobSchema
    from rallypoint.core.records import PluginRecord

    R = TypeVar("R", bound=PluginRecord)

T = TypeVar("T")

__all__ = [
    "ENTRY_POINT_GROUP",
    "ESSENTIAL_GROUP",
    "PROJECT_NAME",
    "essential_distributions",
    "installed_plugins",
    "rallypoint_distributions",
    "LoadFailure",
    "PluginInfo",
    "PluginLoadWarning",
    "RallypointPluginManager",
    "UnknownHookError",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
]

#: Entry points of plugins, loaded unless autoload is disabled.
ENTRY_POINT_GROUP = "rallypoint"
#: Entry points of essential packages, loaded even when autoload is disabled.
ESSENTIAL_GROUP = "rallypoint.essential"
#: The name of core's own plugin (the ``plugins`` and ``config`` commands).
CORE_PLUGIN = "core"

DISABLE_AUTOLOAD_ENV = "RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD"
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


def _version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _env_flag(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("0", "false", "no", "off", "")


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


def essential_distributions() -> list[tuple[str, str | None]]:
    """``(distribution, version)`` of core and of every installed essential package, without importing them."""
    found = [("rallypoint-core", _version_of("rallypoint-core"))]
    for ep in sorted(importlib.metadata.entry_points(group=ESSENTIAL_GROUP), key=lambda e: e.name):
        if ep.dist is not None and ep.dist.name not in {name for name, _ in found}:
            found.append((ep.dist.name, ep.dist.version))
    return found


def rallypoint_distributions() -> list[tuple[str, str | None]]:
    """Core and the essential packages, then every distribution that installs a plugin, with versions.

    Read from entry-point metadata only: nothing is imported.
    """
    found = essential_distributions()
    names = {name for name, _ in found}
    extra: dict[str, str | None] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.dist is not None and ep.dist.name not in names:
            extra[ep.dist.name] = ep.dist.version
    return found + sorted(extra.items())


def installed_plugins() -> list[tuple[str, str | None, str | None]]:
    """``(plugin, distribution, version)`` of every ``rallypoint`` entry point, without importing it."""
    out = []
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = ep.dist
        out.append((ep.name, dist.name if dist is not None else None, dist.version if dist is not None else None))
    return out


def _load_core(pm: RallypointPluginManager) -> None:
    pm.essential_names.append(CORE_PLUGIN)
    if CORE_PLUGIN in pm.disabled:
        return
    from rallypoint.core import builtin

    info = PluginInfo(CORE_PLUGIN, "rallypoint-core", _version_of("rallypoint-core"), essential=True)
    pm.register_plugin(builtin, info)


def _load_entry_points(pm: RallypointPluginManager, group: str) -> None:
    essential = group == ESSENTIAL_GROUP
    seen: dict[str, PluginInfo] = {}
    for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
        dist = ep.dist.name if ep.dist is not None else None
        version = ep.dist.version if ep.dist is not None else None
        info = PluginInfo(ep.name, dist, version, essential=essential)
        if essential and ep.name not in pm.essential_names:
            pm.essential_names.append(ep.name)
        if ep.name in pm.disabled:
            continue
        if ep.name in seen:
            if seen[ep.name].distribution == dist:
                continue  # the same distribution seen twice on sys.path
            conflict = PluginConflictError("plugin", ep.name, seen[ep.name].describe(), info.describe())
            pm._fail(info, PluginLoadError(ep.name, f"{dist} {version}", conflict))
            continue
        seen[ep.name] = info
        if pm.has_plugin(ep.name):
            first = pm.info_for(pm.get_plugin(ep.name)).describe()
            conflict = PluginConflictError("plugin", ep.name, first, info.describe())
            pm._fail(info, PluginLoadError(ep.name, f"{dist} {version}", conflict))
            continue
        try:
            plugin = ep.load()
            pm.register_plugin(plugin, info)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the others
            pm._fail(info, exc)
            continue
        if not essential:
            pm.from_entry_points.add(ep.name)


def _set_aside_orphans(pm: RallypointPluginManager) -> None:
    """Turn plugins that implement hooks of an absent essential package into load failures.

    When an essential package is disabled (``RALLYPOINT_DISABLE_PLUGINS=<name>``) or failed to
    load, its hook specifications are never added, so every plugin implementing its hooks would
    fail :meth:`~pluggy.PluginManager.check_pending` and stop every command. Such a plugin is
    unregistered and reported instead. With every essential package present an unknown hook is
    still an error (a misspelled hook name, or a package that is not installed).
    """
    missing = [name for name in pm.essential_names if not pm.has_plugin(name)]
    if not missing:
        return
    for hook_name in list(vars(pm.hook)):
        caller = getattr(pm.hook, hook_name)
        if hook_name.startswith("_") or not isinstance(caller, pluggy.HookCaller) or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            info = pm.info_for(impl.plugin)
            if impl.optionalhook or info.essential or not pm.is_registered(impl.plugin):
                continue
            pm.unregister(impl.plugin)
            pm._fail(
                info,
                PluginError(
                    f"it implements {hook_name}, a hook that no installed package declares "
                    f"(essential packages disabled or not loaded: {', '.join(missing)})"
                ),
            )


def get_plugin_manager(
    *,
    plugins: Iterable[object] | Mapping[str, object] = (),
    autoload: bool | None = None,
    disabled: Iterable[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> RallypointPluginManager:
    """Build a fresh, fully loaded plugin manager.

    Registers, in this order: core's own plugin, the essential packages (entry-point group
    ``rallypoint.essential``, by name), the plugins of the ``rallypoint`` group (by name) unless
    autoload is off, then ``plugins``.

    Args:
        plugins: extra plugin objects (modules or instances with ``@hookimpl`` methods) to register
            last, e.g. from tests. A mapping gives them names.
        autoload: load the ``rallypoint`` entry points; default: unless
            ``RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD`` is set. Essential packages load either way.
        disabled: plugin names never to register; default: ``RALLYPOINT_DISABLE_PLUGINS``.
        environ: where to read the environment controls (default :data:`os.environ`).

    Returns:
        The manager. Plugins that failed to load are listed in
        :attr:`RallypointPluginManager.load_failures` and reported as
        :class:`PluginLoadWarning`; they do not stop the others.

    Raises:
        pluggy.PluginValidationError: a registered plugin implements a hook that no
            specification declares (usually a misspelled hook name). When an essential package
            is disabled or failed to load, plugins implementing hooks nobody declares are
            unregistered and reported as load failures instead.

    Example:
        >>> pm = get_plugin_manager(autoload=False)
        >>> "core" in pm.infos
        True
    """
    from rallypoint.core import hookspecs

    env = os.environ if environ is None else environ
    pm = RallypointPluginManager()
    if disabled is None:
        disabled = [n for n in env.get(DISABLE_PLUGINS_ENV, "").replace(" ", "").split(",") if n]
    pm.disabled = frozenset(disabled)
    for name in pm.disabled:
        pm.set_blocked(name)
    pm.add_hookspecs(hookspecs)
    pm.hook.rallypoint_addhooks.call_historic(kwargs={"pluginmanager": pm})

    _load_core(pm)
    _load_entry_points(pm, ESSENTIAL_GROUP)
    if autoload is None:
        autoload = not _env_flag(env.get(DISABLE_AUTOLOAD_ENV))
    if autoload:
        _load_entry_points(pm, ENTRY_POINT_GROUP)

    items: Iterable[tuple[str | None, object]] = (
        plugins.items() if isinstance(plugins, Mapping) else ((None, p) for p in plugins)
    )
    for given_name, plugin in items:
        plugin_name = given_name or getattr(plugin, "__name__", None) or f"{type(plugin).__name__}-{id(plugin):x}"
        module = plugin if isinstance(plugin, ModuleType) else None
        dist: str | None = getattr(module, "__distribution__", None) if module else None
        pm.register_plugin(plugin, PluginInfo(plugin_name, dist, _version_of(dist) if dist else None))

    _set_aside_orphans(pm)
    _set_aside_misspelled(pm)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise _hook_error(pm, exc) from None
    return pm


class UnknownHookError(PluginError, pluggy.PluginValidationError):
    """A plugin implements a hook that no installed package declares (usually a misspelling).

    It is both a :class:`~rallypoint.core.errors.PluginError` (the CLI shows the message and
    exits 2) and a :class:`pluggy.PluginValidationError`.
    """

    def __init__(self, plugin: object, message: str) -> None:
        pluggy.PluginValidationError.__init__(self, plugin, message)


def _unknown_hooks(pm: RallypointPluginManager, plugin: object) -> list[str]:
    """The hooks ``plugin`` implements that no specification declares."""
    return [
        name
        for name in vars(pm.hook)
        if not name.startswith("_")
        and isinstance(getattr(pm.hook, name), pluggy.HookCaller)
        and not getattr(pm.hook, name).has_spec()
        and any(impl.plugin is plugin for impl in getattr(pm.hook, name).get_hookimpls())
    ]


def _closest_hook(pm: RallypointPluginManager, hook: str) -> str | None:
    from rallypoint.core.errors import did_you_mean

    known = [name for name in vars(pm.hook) if getattr(pm.hook, name).has_spec()]
    # compare what follows the shared "rallypoint_" prefix, which would make every hook look alike
    prefix = f"{PROJECT_NAME}_"
    stem = did_you_mean(hook.removeprefix(prefix), [k.removeprefix(prefix) for k in known])
    return next((k for k in known if k.removeprefix(prefix) == stem), None) if stem else None


def _set_aside_misspelled(pm: RallypointPluginManager) -> None:
    """Turn an installed plugin implementing an unknown hook (a misspelling) into a load failure.

    One broken third-party plugin must not stop every command: it is unregistered and reported
    (``rallypoint plugins list``, a warning), and a job selecting a name it would have registered
    through the misspelled hook gets the error. Plugins of essential packages and plugins passed
    in code still make :func:`get_plugin_manager` raise.
    """
    from rallypoint.core.records import normalize_name

    for name in sorted(pm.from_entry_points):
        plugin = pm.get_plugin(name)
        unknown = _unknown_hooks(pm, plugin) if plugin is not None else []
        if not unknown:
            continue
        error = _hook_error(pm, pluggy.PluginValidationError(plugin, "unknown hook"))
        provides: set[str] = set()
        for hook in unknown:
            for impl in getattr(pm.hook, hook).get_hookimpls():
                if impl.plugin is plugin and _closest_hook(pm, hook) and not impl.argnames:
                    # what it meant to register: a job that selects it is told why it is missing
                    with contextlib.suppress(Exception):  # the plugin is broken already; its names are a bonus
                        provides.update(normalize_name(r.name) for r in impl.function() or () if hasattr(r, "name"))
        pm.unregister(plugin)
        pm.from_entry_points.discard(name)
        pm.load_failures.append(LoadFailure(pm.infos[name], error, frozenset(provides)))
        warnings.warn(str(error), PluginLoadWarning, stacklevel=3)


def _hook_error(pm: RallypointPluginManager, exc: pluggy.PluginValidationError) -> UnknownHookError:
    info = pm.info_for(exc.plugin)
    unknown = _unknown_hooks(pm, exc.plugin)
    hook = unknown[0] if unknown else "?"
    guess = _closest_hook(pm, hook)
    hint = f"; did you mean {guess!r}?" if guess else "."
    return UnknownHookError(
        exc.plugin,
        f"plugin {info.describe()} implements {hook!r}, a hook that no installed package declares{hint} "
        f"Fix the hook name in the plugin, install the package that declares it, "
        f"or disable the plugin with {DISABLE_PLUGINS_ENV}={info.name}",
    )
