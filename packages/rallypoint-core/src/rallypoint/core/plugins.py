"""The rallypoint plugin system.

One pluggy project, ``rallypoint``: use :data:`hookimpl` to implement hooks and :data:`hookspec`
to declare them. :func:`get_plugin_manager` builds a manager on demand (there is no module-level
manager): it registers the built-in subsystems that are installed, loads the plugins advertised
in the ``rallypoint`` entry-point group, and checks that every implemented hook has a
specification, so a misspelled hook name is an error rather than silently ignored.

Environment controls:

``RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD``
    When set to a non-empty value other than ``0``, entry points are not loaded; only built-ins
    (and plugins passed explicitly) are registered.
``RALLYPOINT_DISABLE_PLUGINS``
    Comma-separated plugin names (entry-point names such as ``etcd``, or built-in names such as
    ``timer``) that are never registered.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from rallypoint.core.errors import PluginConflictError, PluginError, PluginLoadError

if TYPE_CHECKING:
    from rallypoint.core.registry import PluginKind, Registry

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "PROJECT_NAME",
    "BuiltinPlugin",
    "LoadFailure",
    "PluginInfo",
    "PluginLoadWarning",
    "RallypointPluginManager",
    "UnknownHookError",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
]

PROJECT_NAME = "rallypoint"
ENTRY_POINT_GROUP = "rallypoint"

#: Marker for hook specifications: ``@hookspec`` on an empty function whose signature is the contract.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Marker for hook implementations: ``@hookimpl`` on a function named after the hook.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

DISABLE_AUTOLOAD_ENV = "RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD"
DISABLE_PLUGINS_ENV = "RALLYPOINT_DISABLE_PLUGINS"


class PluginLoadWarning(UserWarning):
    """A plugin failed to load; everything that does not need it keeps working."""


@dataclass(frozen=True)
class BuiltinPlugin:
    """A framework package registered without an entry point, when it is installed.

    Attributes:
        name: plugin name, e.g. ``"rendezvous"``.
        module: the module holding its hook implementations.
        distribution: the distribution that ships it.
    """

    name: str
    module: str
    distribution: str


#: The framework's own packages. Each is registered when installed, even with autoload off.
BUILTIN_PLUGINS: tuple[BuiltinPlugin, ...] = (
    BuiltinPlugin("core", "rallypoint.core.builtin", "rallypoint-core"),
    BuiltinPlugin("rendezvous", "rallypoint.rendezvous.plugin", "rallypoint-rendezvous"),
    BuiltinPlugin("agent", "rallypoint.agent.plugin", "rallypoint-agent"),
    BuiltinPlugin("timer", "rallypoint.timer.plugin", "rallypoint-timer"),
    BuiltinPlugin("collectives", "rallypoint.collectives.plugin", "rallypoint-collectives"),
    BuiltinPlugin("rpc", "rallypoint.rpc.plugin", "rallypoint-rpc"),
)


@dataclass(frozen=True)
class PluginInfo:
    """Where a registered plugin comes from.

    Attributes:
        name: the plugin's name in the manager (entry-point name or built-in name).
        distribution: the distribution that installed it, e.g. ``"rallypoint-etcd"``;
            ``None`` for a plugin registered directly from code.
        version: that distribution's version, if known.
        builtin: whether it is one of :data:`BUILTIN_PLUGINS`.
    """

    name: str
    distribution: str | None
    version: str | None
    builtin: bool = False

    def describe(self) -> str:
        """``"name (distribution version)"``, the way error messages name a plugin."""
        if self.distribution:
            return f"{self.name} ({self.distribution} {self.version or '?'})".replace(" ?)", ")")
        return self.name


@dataclass(frozen=True)
class LoadFailure:
    """A plugin that could not be loaded, kept so that selecting it explains why it is missing."""

    info: PluginInfo
    error: PluginLoadError


def _version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _env_flag(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("0", "false", "no", "off", "")


class RallypointPluginManager(pluggy.PluginManager):
    """A :class:`pluggy.PluginManager` that remembers where each plugin came from.

    Use :func:`get_plugin_manager` to build one.
    """

    def __init__(self) -> None:
        super().__init__(PROJECT_NAME)
        self.infos: dict[str, PluginInfo] = {}
        self.load_failures: list[LoadFailure] = []
        self.disabled: frozenset[str] = frozenset()
        self._registries: dict[str, Registry[Any]] = {}

    def register_plugin(self, plugin: object, info: PluginInfo) -> None:
        """Register ``plugin`` under ``info.name`` and remember its provenance."""
        self.register(plugin, name=info.name)
        self.infos[info.name] = info
        self._registries.clear()

    def info_for(self, plugin: object) -> PluginInfo:
        """Provenance of a registered plugin object."""
        name = self.get_name(plugin) or repr(plugin)
        return self.infos.get(name) or PluginInfo(name=name, distribution=None, version=None)

    def registry(self, kind: PluginKind) -> Registry[Any]:
        """The registry of ``kind`` (collected once per manager, then cached)."""
        from rallypoint.core.registry import Registry

        if kind.hook not in self._registries:
            self._registries[kind.hook] = Registry.collect(self, kind)
        return self._registries[kind.hook]

    def failure_named(self, name: str) -> LoadFailure | None:
        """The load failure of the plugin called ``name``, if it failed to load."""
        for failure in self.load_failures:
            if failure.info.name == name:
                return failure
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


def _load_builtins(pm: RallypointPluginManager) -> None:
    for builtin in BUILTIN_PLUGINS:
        if builtin.name in pm.disabled:
            continue
        info = PluginInfo(builtin.name, builtin.distribution, _version_of(builtin.distribution), builtin=True)
        try:
            if importlib.util.find_spec(builtin.module) is None:
                continue
        except ImportError:  # the parent package is not installed
            continue
        try:
            module = importlib.import_module(builtin.module)
            pm.register_plugin(module, info)
        except Exception as exc:  # noqa: BLE001 - a broken package must not break the others
            pm._fail(info, exc)


def _load_entry_points(pm: RallypointPluginManager) -> None:
    seen: dict[str, PluginInfo] = {}
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = ep.dist.name if ep.dist is not None else None
        version = ep.dist.version if ep.dist is not None else None
        info = PluginInfo(ep.name, dist, version)
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
            pm._fail(
                info,
                PluginLoadError(
                    ep.name,
                    f"{dist} {version}",
                    PluginConflictError(
                        "plugin", ep.name, pm.info_for(pm.get_plugin(ep.name)).describe(), info.describe()
                    ),
                ),
            )
            continue
        try:
            plugin = ep.load()
            pm.register_plugin(plugin, info)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the others
            pm._fail(info, exc)


def _set_aside_orphans(pm: RallypointPluginManager) -> None:
    """Turn plugins that implement hooks of an absent built-in package into load failures.

    When a built-in package is disabled (``RALLYPOINT_DISABLE_PLUGINS=collectives``) or not
    installed, its hook specifications are never added, so every plugin implementing its hooks
    would fail :meth:`~pluggy.PluginManager.check_pending` and stop every command. Such a plugin is
    unregistered and reported instead. With every built-in present an unknown hook is still an
    error (a misspelled hook name).
    """
    missing = [b.name for b in BUILTIN_PLUGINS if not pm.has_plugin(b.name)]
    if not missing:
        return
    for hook_name in list(vars(pm.hook)):
        caller = getattr(pm.hook, hook_name)
        if hook_name.startswith("_") or not isinstance(caller, pluggy.HookCaller) or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            info = pm.info_for(impl.plugin)
            if impl.optionalhook or info.builtin or not pm.is_registered(impl.plugin):
                continue
            pm.unregister(impl.plugin)
            pm._fail(
                info,
                PluginError(
                    f"it implements {hook_name}, a hook that no installed package declares "
                    f"(built-in packages disabled or not installed: {', '.join(missing)})"
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

    Args:
        plugins: extra plugin objects (modules or instances with ``@hookimpl`` methods) to register
            after the built-ins, e.g. from tests. A mapping gives them names.
        autoload: load the ``rallypoint`` entry points; default: unless
            ``RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD`` is set.
        disabled: plugin names never to register; default: ``RALLYPOINT_DISABLE_PLUGINS``.
        environ: where to read the environment controls (default :data:`os.environ`).

    Returns:
        The manager. Plugins that failed to load are listed in
        :attr:`RallypointPluginManager.load_failures` and reported as
        :class:`PluginLoadWarning`; they do not stop the others.

    Raises:
        pluggy.PluginValidationError: a registered plugin implements a hook that no
            specification declares (usually a misspelled hook name). When a built-in package
            is disabled or not installed, plugins implementing hooks nobody declares are
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

    _load_builtins(pm)
    if autoload is None:
        autoload = not _env_flag(env.get(DISABLE_AUTOLOAD_ENV))
    if autoload:
        _load_entry_points(pm)

    items: Iterable[tuple[str | None, object]] = (
        plugins.items() if isinstance(plugins, Mapping) else ((None, p) for p in plugins)
    )
    for given_name, plugin in items:
        plugin_name = given_name or getattr(plugin, "__name__", None) or f"{type(plugin).__name__}-{id(plugin):x}"
        module = plugin if isinstance(plugin, ModuleType) else None
        dist: str | None = getattr(module, "__distribution__", None) if module else None
        pm.register_plugin(plugin, PluginInfo(plugin_name, dist, _version_of(dist) if dist else None))

    _set_aside_orphans(pm)
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


def _hook_error(pm: RallypointPluginManager, exc: pluggy.PluginValidationError) -> UnknownHookError:
    from rallypoint.core.errors import did_you_mean

    info = pm.info_for(exc.plugin)
    known = [name for name in vars(pm.hook) if getattr(pm.hook, name).has_spec()]
    unknown = [
        name
        for name in vars(pm.hook)
        if not name.startswith("_")
        and not getattr(pm.hook, name).has_spec()
        and any(impl.plugin is exc.plugin for impl in getattr(pm.hook, name).get_hookimpls())
    ]
    hook = unknown[0] if unknown else "?"
    guess = did_you_mean(hook, known)
    hint = f"; did you mean {guess!r}?" if guess else ""
    return UnknownHookError(
        exc.plugin,
        f"plugin {info.describe()} implements {hook!r}, a hook that no installed package declares{hint} "
        f"Fix the hook name in the plugin, or disable it with {DISABLE_PLUGINS_ENV}={info.name}",
    )
