"""A job as a command line gives it: the job file, ``RALLYPOINT_*`` variables and flags, loaded and resolved once.

Shared by the commands that take a job (``rallypoint run``, ``rallypoint status``, ``rallypoint debug
stacks``): each turns its flags into overrides (key, value, source), and these functions load the job
with them, in order (last wins), and resolve its plugins. ``--rdzv-endpoint`` sets whichever option
the selected backend names for its endpoint, known only once the backend is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rallypoint.core.errors import ConfigError, ConfigIssue

if TYPE_CHECKING:
    from rallypoint.agent.launch import LaunchFacts
    from rallypoint.core.config import LoadedConfig, ResolvedConfig
    from rallypoint.core.plugins import RallypointPluginManager

__all__ = ["FLAG", "load_job", "resolve_job", "resolve_job_in_environment"]

#: The source a value given on the command line is reported with.
FLAG = "(command line)"


def _endpoint_override(backend: str, endpoint: str, pm: RallypointPluginManager) -> tuple[str, Any, str]:
    """``--rdzv-endpoint VALUE`` as the override of the option the backend names for it."""
    from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS

    record = pm.registry(RENDEZVOUS_BACKENDS).get(backend, where="rendezvous.backend")
    option = record.endpoint_option
    if option is None:
        raise ConfigError(
            [
                ConfigIssue(
                    f"--rdzv-endpoint {FLAG}",
                    "rendezvous.options",
                    f"rendezvous backend {record.name!r} takes no endpoint; remove --rdzv-endpoint",
                )
            ]
        )
    return (f"rendezvous.options.{option}", endpoint, f"--rdzv-endpoint {FLAG}")


def load_job(
    job_file: str | None,
    overrides: Sequence[tuple[str, Any, str]],
    rdzv_endpoint: str | None,
    pm: RallypointPluginManager,
) -> LoadedConfig:
    """Load the job (file, ``RALLYPOINT_*``, flags; ``overrides`` applied in order, last wins), once."""
    from rallypoint.core.config import load_job_config

    given = [o for o in overrides if o[1] is not None]
    derived = None if rdzv_endpoint is None else _endpoint_for_backend(rdzv_endpoint, pm)
    return load_job_config(job_file, pm, overrides=given, derived=derived)


def _endpoint_for_backend(
    endpoint: str, pm: RallypointPluginManager
) -> Callable[[Mapping[str, Any]], list[tuple[str, Any, str]]]:
    """``--rdzv-endpoint`` as a derived override: the option it sets is the selected backend's."""
    from rallypoint.rendezvous.config import RendezvousSection
    from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS

    default = RendezvousSection.model_fields["backend"].default

    def override(values: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
        section = values.get("rendezvous", {})
        backend = section.get("backend", default) if isinstance(section, Mapping) else None
        # an unknown or malformed backend: no override; validation or resolution names it, and where it was set
        if not isinstance(backend, str) or backend not in pm.registry(RENDEZVOUS_BACKENDS).names():
            return []
        return [_endpoint_override(backend, endpoint, pm)]

    return override


def resolve_job(
    job_file: str | None,
    overrides: list[tuple[str, Any, str]],
    rdzv_endpoint: str | None,
    pm: RallypointPluginManager,
) -> ResolvedConfig:
    """Load the job (file, ``RALLYPOINT_*``, flags) and resolve its plugins, once."""
    from rallypoint.core.config import resolve_config

    return resolve_config(load_job(job_file, overrides, rdzv_endpoint, pm), pm)


def resolve_job_in_environment(
    job_file: str | None,
    overrides: list[tuple[str, Any, str]],
    rdzv_endpoint: str | None,
    pm: RallypointPluginManager,
) -> tuple[ResolvedConfig, LaunchFacts | None]:
    """The job with what the launch environment (Slurm, Kubernetes) fills in, resolved once; its facts.

    The environment's values come first, so that the job file, ``RALLYPOINT_*`` and flags win.
    """
    from rallypoint.agent.launch import resolve_in_environment

    def load(filled: Sequence[tuple[str, Any, str]]) -> LoadedConfig:
        return load_job(job_file, [*filled, *overrides], rdzv_endpoint, pm)

    return resolve_in_environment(load, pm, os.environ)


def running_job_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the arguments that name a running job: ``[JOB_FILE]`` and its flags.

    ``--rdzv-backend``, ``--rdzv-endpoint``, ``--run-id`` and ``--set`` (torchrun's spellings too),
    as ``rallypoint run`` takes them.
    """
    import click

    for option in reversed(
        [
            click.argument("job_file", required=False),
            click.option(
                "--rdzv-backend", "--rdzv_backend", "rdzv_backend", metavar="NAME", help="Rendezvous backend."
            ),
            click.option(
                "--rdzv-endpoint", "--rdzv_endpoint", "rdzv_endpoint", metavar="VALUE", help="Backend endpoint."
            ),
            click.option("--run-id", "--rdzv-id", "--rdzv_id", "run_id", metavar="ID", help="The job's run id."),
            click.option("--set", "-s", "set_values", multiple=True, metavar="KEY=VALUE", help="Override any job key."),
        ]
    ):
        command = option(command)
    return command


def resolve_running_job(
    job_file: str | None,
    rdzv_backend: str | None,
    rdzv_endpoint: str | None,
    run_id: str | None,
    set_values: Sequence[str],
    pm: RallypointPluginManager,
) -> ResolvedConfig:
    """The job that :func:`running_job_options` name, resolved once (torchrun's backend names mapped)."""
    from rallypoint.agent.torchrun_flags import endpoint_value
    from rallypoint.core.commands import _parse_set

    overrides: list[tuple[str, Any, str]] = []
    if rdzv_backend:
        backend_name = {"c10d": "grpc", "etcd-v2": "etcd"}.get(rdzv_backend, rdzv_backend)
        overrides.append(("rendezvous.backend", backend_name, f"--rdzv-backend {FLAG}"))
    if run_id:
        overrides.append(("rendezvous.run_id", run_id, f"--run-id {FLAG}"))
    overrides += _parse_set(tuple(set_values))
    endpoint = endpoint_value({"rdzv_backend": rdzv_backend}, rdzv_endpoint)
    return resolve_job(job_file, overrides, endpoint, pm)
