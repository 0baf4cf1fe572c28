"""Job configuration: a TOML file, layered with ``RALLYPOINT_*`` variables and command-line flags.

Phase 1 (:func:`load_job_config`) checks the structure; phase 2 (:func:`resolve_config`) looks up
each selected plugin and validates its ``options`` table. Both raise
:class:`~rallypoint.core.errors.ConfigError` listing every problem with its file and key path.
"""

from rallypoint.core.config.durations import Duration, format_duration, parse_duration
from rallypoint.core.config.loader import LoadedConfig, load_job_config, parse_value
from rallypoint.core.config.models import JobConfig
from rallypoint.core.config.render import render_resolved
from rallypoint.core.config.resolve import ResolvedConfig, Selection, resolve_config

__all__ = [
    "Duration",
    "JobConfig",
    "LoadedConfig",
    "ResolvedConfig",
    "Selection",
    "format_duration",
    "load_job_config",
    "parse_duration",
    "parse_value",
    "render_resolved",
    "resolve_config",
]
