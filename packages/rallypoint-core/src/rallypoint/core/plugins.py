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

This module loads; the manager is :mod:`rallypoint.core.plugin_manager`, what is installed is read
by :mod:`rallypoint.core.installed`, and plugins implementing hooks nobody declares are set aside
by :mod:`rallypoint.core.unknown_hooks`. Their public names are importable from here too.

Environment controls:

``RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD``
    When set to a non-empty value other than ``0``, the ``rallypoint`` entry points are not
    loaded; core and the essential packages (and plugins passed explicitly) still are.
``RALLYPOINT_DISABLE_PLUGINS``
    Comma-separated plugin names (entry-point names, essential ones included) that are never
    registered.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable, Mapping
from types import ModuleType

import pluggy

from rallypoint.core.errors import PluginConflictError, PluginLoadError
from rallypoint.core.installed import (
    ENTRY_POINT_GROUP,
    ESSENTIAL_GROUP,
    essential_distributions,
    installed_plugins,
    rallypoint_distributions,
    version_of,
)
from rallypoint.core.markers import PROJECT_NAME, hookimpl, hookspec
from rallypoint.core.plugin_manager import DISABLE_PLUGINS_ENV, LoadFailure, PluginLoadWarning, RallypointPluginManager
from rallypoint.core.registry import PluginInfo
from rallypoint.core.unknown_hooks import UnknownHookError, hook_error, set_aside_misspelled, set_aside_orphans

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

#: The name of core's own plugin (the ``plugins`` and ``config`` commands).
CORE_PLUGIN = "core"

DISABLE_AUTOLOAD_ENV = "RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD"
# DISABLE_PLUGINS_ENV ("RALLYPOINT_DISABLE_PLUGINS") lives with the manager, which names it in messages.


def _env_flag(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("0", "false", "no", "off", "")


def _load_core(pm: RallypointPluginManager) -> None:
    pm.essential_names.append(CORE_PLUGIN)
    if CORE_PLUGIN in pm.disabled:
        return
    from rallypoint.core import builtin

    info = PluginInfo(CORE_PLUGIN, "rallypoint-core", version_of("rallypoint-core"), essential=True)
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
        pm.register_plugin(plugin, PluginInfo(plugin_name, dist, version_of(dist) if dist else None))

    set_aside_orphans(pm)
    set_aside_misspelled(pm)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise hook_error(pm, exc) from None
    return pm
