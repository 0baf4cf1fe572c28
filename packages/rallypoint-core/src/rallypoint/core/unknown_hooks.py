"""Plugins implementing hooks that no installed package declares: found, explained, set aside.

A hook nobody declares is a misspelling (:func:`set_aside_misspelled`, with a guess of the hook
meant) or the hook of an essential package that is disabled or failed to load
(:func:`set_aside_orphans`). Either way the plugin is unregistered and reported as a load failure,
so one broken plugin does not stop every command; what is left is reported by
:func:`hook_error` as an :class:`UnknownHookError`.
"""

from __future__ import annotations

import contextlib
import warnings

import pluggy

from rallypoint.core.errors import PluginError
from rallypoint.core.markers import PROJECT_NAME
from rallypoint.core.plugin_manager import DISABLE_PLUGINS_ENV, LoadFailure, PluginLoadWarning, RallypointPluginManager

__all__ = ["UnknownHookError", "hook_error", "set_aside_misspelled", "set_aside_orphans"]


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


def set_aside_misspelled(pm: RallypointPluginManager) -> None:
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
        error = hook_error(pm, pluggy.PluginValidationError(plugin, "unknown hook"))
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


def hook_error(pm: RallypointPluginManager, exc: pluggy.PluginValidationError) -> UnknownHookError:
    """The error for ``exc``: which plugin, which hook, the hook probably meant, and what to do."""
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


def set_aside_orphans(pm: RallypointPluginManager) -> None:
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
