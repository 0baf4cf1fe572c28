"""What is installed, read from entry-point metadata without importing anything.

The two entry-point groups (:data:`ENTRY_POINT_GROUP` for plugins, :data:`ESSENTIAL_GROUP` for
the packages the framework cannot work without), and the distributions and plugins found in
them, with their versions (``rallypoint --version``, ``rallypoint plugins list``).
"""

from __future__ import annotations

import importlib.metadata

__all__ = [
    "ENTRY_POINT_GROUP",
    "ESSENTIAL_GROUP",
    "essential_distributions",
    "installed_plugins",
    "rallypoint_distributions",
    "version_of",
]

#: Entry points of plugins, loaded unless autoload is disabled.
ENTRY_POINT_GROUP = "rallypoint"
#: Entry points of essential packages, loaded even when autoload is disabled.
ESSENTIAL_GROUP = "rallypoint.essential"


def version_of(distribution: str) -> str | None:
    """The installed version of ``distribution`` (``None`` when it is not installed)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def essential_distributions() -> list[tuple[str, str | None]]:
    """``(distribution, version)`` of core and of every installed essential package, without importing them."""
    found = [("rallypoint-core", version_of("rallypoint-core"))]
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
