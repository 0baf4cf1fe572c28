"""rallypoint core: the plugin system, typed registration records, registries, job config and CLI root.

Import what you need from the submodules:

- :mod:`rallypoint.core.plugins`: ``hookspec``/``hookimpl`` markers and :func:`get_plugin_manager`;
- :mod:`rallypoint.core.records`: the record types registration hooks return;
- :mod:`rallypoint.core.registry`: plugin kinds and the typed :class:`Registry`;
- :mod:`rallypoint.core.config`: loading and validating job files;
- :mod:`rallypoint.core.errors`: the errors users see.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rallypoint-core")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = ["__version__"]
