"""A job as loaded in the environment a command runs in: what the declared sections take from it.

A section may fill in keys the job left at their defaults from the process environment
(:attr:`ConfigSection.from_environment <rallypoint.core.config.sections.ConfigSection>`: the
agent's ``[launch]`` section does, inside a Slurm allocation or a Kubernetes pod).
:func:`load_in_environment` loads the job, asks every declared section, and loads it again with
what they gave under the job's own values, each labelled with where it came from.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rallypoint.core.config.loader import LoadedConfig, SchemaSource, load_job_config
from rallypoint.core.records import load_object

if TYPE_CHECKING:
    from rallypoint.core.config.sections import JobSchema

__all__ = ["environment_overrides", "load_in_environment"]


def environment_overrides(loaded: LoadedConfig, pm: Any, environ: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    """What the job's declared sections take from ``environ`` for the keys ``loaded`` left at their defaults.

    ``pm`` (the plugin manager) is handed to each section's ``from_environment``.
    """
    filled: list[tuple[str, Any, str]] = []
    for declared in loaded.schema.sections:
        source = declared.from_environment
        if source is None or getattr(loaded.config, declared.name, None) is None:
            continue
        take = load_object(source) if isinstance(source, str) else source
        filled += [o for o in take(loaded, pm, environ) if not loaded.is_explicit(o[0])]
    return filled


def load_in_environment(
    path: str | os.PathLike[str] | Path | None,
    pm: SchemaSource | JobSchema,
    *,
    overrides: Iterable[tuple[str, Any, str]] = (),
    environ: Mapping[str, str] | None = None,
) -> LoadedConfig:
    """:func:`~rallypoint.core.config.load_job_config` with what the environment fills in.

    ``pm``: the plugin manager (or a bare :class:`JobSchema`), whose job schema the job is
    loaded with; it is handed to each section's ``from_environment``.

    The job is loaded as given (file, ``RALLYPOINT_*`` variables, ``overrides``); when a
    declared section takes values from ``environ`` (default :data:`os.environ`) for keys left
    at their defaults, it is loaded again with them: their sources say where they came from.

    Raises:
        ConfigError: the job is invalid, or the environment a section reads is malformed.
    """
    env = os.environ if environ is None else environ
    given = list(overrides)
    loaded = load_job_config(path, pm, environ=env, overrides=given)
    filled = environment_overrides(loaded, pm, env)
    return load_job_config(path, pm, environ=env, overrides=[*filled, *given]) if filled else loaded
