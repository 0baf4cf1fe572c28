"""Detecting the launch environment and filling in what the job does not say.

:func:`detect` picks the launch environment ``[launch] environment`` names (``auto``: the first,
by ``order``, whose detector recognizes the agent's environment variables) and returns its
:class:`~rallypoint.agent.launch.facts.LaunchFacts`. :func:`launch_overrides` turns them into
job-key overrides for the keys the job file, ``RALLYPOINT_*`` variables and flags left at their
defaults, each labelled with the variables it came from: they show as such in ``--dry-run``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rallypoint.agent.config import LaunchSection
from rallypoint.agent.launch.facts import LaunchFacts
from rallypoint.agent.launch.hostlist import HostListError
from rallypoint.agent.records import LAUNCH_ENVIRONMENTS, LaunchEnvironmentRecord
from rallypoint.core.config import LoadedConfig, ResolvedConfig, resolve_config
from rallypoint.core.errors import ConfigError, ConfigIssue
from rallypoint.core.plugins import RallypointPluginManager

__all__ = ["config_from_environment", "detect", "launch_overrides", "resolve_in_environment"]

#: The rendezvous backend a launch environment selects when the job names none: agent-hosted gRPC.
DEFAULT_BACKEND = "grpc"


def _detect_with(record: LaunchEnvironmentRecord, environ: Mapping[str, str]) -> LaunchFacts | None:
    try:
        facts: LaunchFacts | None = record.load()(environ)
    except HostListError as exc:
        raise ConfigError([ConfigIssue(f"{record.name} launch environment", "launch.environment", str(exc))]) from None
    return facts


def detect(loaded: LoadedConfig, pm: RallypointPluginManager, environ: Mapping[str, str]) -> LaunchFacts | None:
    """The selected launch environment's facts; ``None`` for ``none`` or when nothing is detected.

    Read from the loaded job, before its plugins are resolved: what the environment fills in is
    part of the job that is then resolved once. A name that is no installed launch environment
    gives ``None`` here; resolving the job names it as unknown.

    Raises:
        ConfigError: a launch environment named in the job file does not recognize the
            environment (``slurm`` outside a Slurm job), or its variables are malformed.
    """
    section = loaded.section(LaunchSection)
    registry = pm.registry(LAUNCH_ENVIRONMENTS)
    if section.environment == "auto":
        for record in sorted(registry, key=lambda r: (r.order, r.name)):
            if record.order >= 0 and (facts := _detect_with(record, environ)) is not None:
                return facts
        return None
    if section.environment not in registry:
        return None
    record = registry.get(section.environment)
    facts = _detect_with(record, environ)
    if facts is None and record.order >= 0:
        raise ConfigError(
            [
                ConfigIssue(
                    loaded.source_of("launch.environment"),
                    "launch.environment",
                    f"launch environment {section.environment!r} is selected, but this agent was not started by it "
                    '(its variables are missing); run the agent there, or set launch.environment = "auto"',
                )
            ]
        )
    return facts


def launch_overrides(loaded: LoadedConfig, facts: LaunchFacts, port: int) -> list[tuple[str, Any, str]]:
    """Job-key overrides for what the job left at its defaults, taken from ``facts``.

    ``nodes.min`` and ``nodes.max`` (each only where not given), ``rendezvous.run_id``, and,
    when no rendezvous backend is named, the agent-hosted ``grpc`` backend at
    ``<endpoint host>:<port>``; a job that names a backend keeps it (and its endpoint).
    """
    out: list[tuple[str, Any, str]] = []
    if not loaded.is_explicit("nodes.min"):
        out.append(("nodes.min", facts.nnodes, facts.source_of("nnodes")))
    if not loaded.is_explicit("nodes.max"):
        out.append(("nodes.max", facts.nnodes, facts.source_of("nnodes")))
    if not loaded.is_explicit("rendezvous.run_id"):
        out.append(("rendezvous.run_id", facts.run_id, facts.source_of("run_id")))
    backend_given = loaded.is_explicit("rendezvous.backend")
    if not backend_given:
        out.append(("rendezvous.backend", DEFAULT_BACKEND, f"{facts.environment} (launch environment default)"))
    backend = (
        DEFAULT_BACKEND if not backend_given else getattr(getattr(loaded.config, "rendezvous", None), "backend", "")
    )
    if backend == DEFAULT_BACKEND and not loaded.is_explicit("rendezvous.options.endpoint"):
        host = facts.endpoint_host
        endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        out.append(("rendezvous.options.endpoint", endpoint, facts.source_of("endpoint_host")))
    return out


def config_from_environment(
    loaded: LoadedConfig, pm: RallypointPluginManager, environ: Mapping[str, str]
) -> list[tuple[str, Any, str]]:
    """What the launch environment fills in, for ``[launch]``'s ``from_environment`` (``rallypoint config show``).

    The same values ``rallypoint run`` takes (:func:`resolve_in_environment`), each labelled with
    the variable it came from; nothing when no launch environment is detected.
    """
    facts = detect(loaded, pm, environ)
    return launch_overrides(loaded, facts, loaded.section(LaunchSection).port) if facts is not None else []


def resolve_in_environment(
    load: Callable[[Sequence[tuple[str, Any, str]]], LoadedConfig],
    pm: RallypointPluginManager,
    environ: Mapping[str, str],
) -> tuple[ResolvedConfig, LaunchFacts | None]:
    """The job with what the launch environment fills in, resolved once, and the facts detected.

    ``load(extra)`` loads the job (file, ``RALLYPOINT_*`` variables, flags) with ``extra``
    overrides applied first: the job is loaded as the user gave it, the launch environment it
    selects is detected, and when that fills anything in the job is loaded again with it (flags
    and job keys still win: only what they left at its default is filled in).

    Raises:
        ConfigError: the job is invalid, or the launch environment it names is not there.
    """
    loaded = load(())
    facts = detect(loaded, pm, environ)
    if facts is not None and (filled := launch_overrides(loaded, facts, loaded.section(LaunchSection).port)):
        loaded = load(filled)
    return resolve_config(loaded, pm), facts
