"""Job configuration: a TOML file, layered with ``RALLYPOINT_*`` variables and command-line flags.

The sections of a job file are declared by the installed packages (:class:`ConfigSection`,
through the ``rallypoint_config_sections`` hook); core provides the :class:`Section` base, the
duration types and the machinery. Phase 1 (:func:`load_job_config`) checks the structure against
the declared sections; phase 2 (:func:`resolve_config`) looks up each selected plugin and
validates its ``options`` table. Both raise :class:`~rallypoint.core.errors.ConfigError` listing
every problem with its file (or variable, or flag) and key path.
"""

from rallypoint.core.config.durations import Duration, PositiveDuration, format_duration, parse_duration
from rallypoint.core.config.environment import environment_overrides, load_in_environment
from rallypoint.core.config.files import file_problem, variable_problem
from rallypoint.core.config.loader import LoadedConfig, load_job_config, parse_value
from rallypoint.core.config.render import render_resolved, section_env
from rallypoint.core.config.resolve import ResolvedConfig, Selection, resolve_config
from rallypoint.core.config.sections import ConfigSection, JobSchema, PerWorker, ProgressFile, Section, build_schema

__all__ = [
    "ConfigSection",
    "Duration",
    "JobSchema",
    "LoadedConfig",
    "PerWorker",
    "ProgressFile",
    "PositiveDuration",
    "ResolvedConfig",
    "Section",
    "Selection",
    "build_schema",
    "environment_overrides",
    "file_problem",
    "format_duration",
    "load_in_environment",
    "load_job_config",
    "parse_duration",
    "parse_value",
    "render_resolved",
    "resolve_config",
    "section_env",
    "variable_problem",
]
