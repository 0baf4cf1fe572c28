"""``rallypoint run`` and ``rallypoint status``.

``rallypoint run`` takes a job file, torchrun-style flags, or both::

    rallypoint run job.toml
    rallypoint run --nproc-per-node 2 train.py --lr 0.1
    rallypoint run --nnodes 2:4 --rdzv-backend file --rdzv-endpoint /shared/rdzv --run-id exp1 job.toml

Flags come before the job file and the script (everything after the script is the script's), and
are applied over the file (and over ``RALLYPOINT_*`` variables), like ``--set KEY=VALUE``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rallypoint.agent.torchrun_flags import torchrun_options
from rallypoint.core.errors import ConfigError, ConfigIssue

if TYPE_CHECKING:
    from rallypoint.agent.launch import LaunchFacts
    from rallypoint.agent.plan import JobPlan
    from rallypoint.core.config import LoadedConfig, ResolvedConfig
    from rallypoint.core.plugins import RallypointPluginManager

__all__ = ["run", "status"]

_FLAG = "(command line)"


def _script_overrides(script: list[str], as_module: bool, job_file: str | None) -> list[tuple[str, Any, str]]:
    """``SCRIPT [ARGS...]`` (or ``-m MODULE [ARGS...]``) as overrides of ``[job]``."""
    if not script:
        return []
    if script[0].startswith("-"):
        raise click.UsageError(
            f"{script[0]}: options go before the job file and the script, "
            f"e.g. rallypoint run {script[0]} ... {job_file or 'train.py'}"
        )
    key = "job.module" if as_module else "job.entrypoint"
    out: list[tuple[str, Any, str]] = [(key, script[0], f"SCRIPT {_FLAG}"), ("job.args", script[1:], f"ARGS {_FLAG}")]
    if as_module:
        out.append(("job.entrypoint", None, f"-m {_FLAG}"))
    elif job_file:
        out.append(("job.module", None, f"SCRIPT {_FLAG}"))
    return out


def _endpoint_override(backend: str, endpoint: str, pm: RallypointPluginManager) -> tuple[str, Any, str]:
    """``--rdzv-endpoint VALUE`` as the override of the option the backend names for it."""
    from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS

    record = pm.registry(RENDEZVOUS_BACKENDS).get(backend, where="rendezvous.backend")
    option = record.endpoint_option
    if option is None:
        raise ConfigError(
            [
                ConfigIssue(
                    f"--rdzv-endpoint {_FLAG}",
                    "rendezvous.options",
                    f"rendezvous backend {record.name!r} takes no endpoint; remove --rdzv-endpoint",
                )
            ]
        )
    return (f"rendezvous.options.{option}", endpoint, f"--rdzv-endpoint {_FLAG}")


def _check_log_dir(path: Path, source: str) -> None:
    """Create the log directory now (private): one that cannot be written or trusted fails before any worker starts."""
    from rallypoint.agent.log_dir import LogDirError, check_location

    problem = None
    try:
        check_location(path)
        if not os.access(path, os.W_OK | os.X_OK):
            problem = "is not writable by this user"
    except LogDirError as exc:
        raise ConfigError([ConfigIssue(source, "agent.log_dir", str(exc))]) from None
    except OSError as exc:
        problem = f"cannot be created ({exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''})"
    if problem:
        message = f"the log directory {str(path)!r} {problem}; give one you can write (--log-dir DIR or agent.log_dir)"
        raise ConfigError([ConfigIssue(source, "agent.log_dir", message)])


def _check_node_names(ctx: click.Context, **names: str | None) -> None:
    """Refuse a ``--node-id`` or ``--host-name`` (or its variable) that cannot name a node in rendezvous keys."""
    from rallypoint.agent.config import check_node_name

    issues = []
    for param, value in names.items():
        if value is None:
            continue
        problem = check_node_name(value, param.replace("_", " "))
        if problem:
            from_env = ctx.get_parameter_source(param) == click.core.ParameterSource.ENVIRONMENT
            flag = "--" + param.replace("_", "-")
            source = f"RALLYPOINT_{param.upper()} (environment)" if from_env else f"{flag} {_FLAG}"
            issues.append(ConfigIssue(source, "", problem))
    if issues:
        raise ConfigError(issues)


def _check_local_addr(ctx: click.Context, local_addr: str | None, from_pet: bool) -> None:
    """Refuse a ``--local-addr`` (or its variable) that is no address: it would become ``MASTER_ADDR``."""
    from rallypoint.agent.config import check_local_addr

    problem = None if local_addr is None else check_local_addr(local_addr)
    if problem:
        if from_pet:
            source = "PET_LOCAL_ADDR (environment)"
        elif ctx.get_parameter_source("local_addr") == click.core.ParameterSource.ENVIRONMENT:
            source = "RALLYPOINT_LOCAL_ADDR (environment)"
        else:
            source = f"--local-addr {_FLAG}"
        raise ConfigError([ConfigIssue(source, "", problem)])


def _with_environment(
    flags: dict[str, Any], as_module: bool, local_addr: str | None
) -> tuple[dict[str, Any], set[str], bool, str | None]:
    """The flags with torchrun's ``PET_*`` variables for those not given (``-m`` and ``--local-addr`` too).

    Returns the torchrun flags, the names of those taken from the environment, ``-m`` and the
    checked ``--local-addr``.
    """
    from rallypoint.agent.torchrun_flags import from_environment

    flags, from_env = from_environment({**flags, "module": as_module, "local_addr": local_addr}, os.environ)
    as_module, local_addr = bool(flags.pop("module")), flags.pop("local_addr")  # PET_MODULE, PET_LOCAL_ADDR too
    _check_local_addr(click.get_current_context(), local_addr, "local_addr" in from_env)
    return flags, from_env, as_module, local_addr


def _load(
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


def _resolve(
    job_file: str | None,
    overrides: list[tuple[str, Any, str]],
    rdzv_endpoint: str | None,
    pm: RallypointPluginManager,
) -> ResolvedConfig:
    """Load the job (file, ``RALLYPOINT_*``, flags) and resolve its plugins, once."""
    from rallypoint.core.config import resolve_config

    return resolve_config(_load(job_file, overrides, rdzv_endpoint, pm), pm)


def _resolve_in_environment(
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
        return _load(job_file, [*filled, *overrides], rdzv_endpoint, pm)

    return resolve_in_environment(load, pm, os.environ)


@click.command(context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False})
@torchrun_options
@click.option("-m", "--module", "as_module", is_flag=True, help="Run SCRIPT as a Python module (python -m).")
@click.option(
    "--preload", metavar="MODULE,...", help="Fork workers from a process that imported these once (agent.preload)."
)
@click.option(
    "--preload-keep",
    metavar="DURATION",
    help="Keep the warm process this long after the job, for the next one (agent.preload_keep).",
)
@click.option(
    "--local-addr",
    "--local_addr",
    "local_addr",
    envvar="RALLYPOINT_LOCAL_ADDR",
    metavar="ADDR",
    help="Address other nodes reach this node at (default: host name; 127.0.0.1 for memory).",
)
@click.option(
    "--host-name",
    envvar="RALLYPOINT_HOST_NAME",
    metavar="NAME",
    help="Host name this node reports (default: the system's); rank strategies order and group by it.",
)
@click.option(
    "--node-id",
    envvar="RALLYPOINT_NODE_ID",
    metavar="ID",
    help="This node's identity in the rendezvous (default: host-pid).",
)
@click.option("--set", "-s", "set_values", multiple=True, metavar="KEY=VALUE", help="Override any job key.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the resolved job (the source of every value) and the plan this node would run; exit.",
)
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print the job and the plan as JSON.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(
    args: tuple[str, ...],
    set_values: tuple[str, ...],
    as_module: bool,
    local_addr: str | None,
    node_id: str | None,
    host_name: str | None,
    dry_run: bool,
    as_json: bool,
    **flags: Any,
) -> int:
    """Run a job: [JOB.toml] [SCRIPT [ARGS...]].

    Rendezvous with the other nodes, assign ranks, start the workers with the torchrun
    environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), restart them on failure within
    the job-wide budget, and print one root-cause report if the job fails. With no job file,
    SCRIPT is required; a torchrun command line works with `rallypoint run` in place of
    `torchrun` (every torchrun flag and its underscore spelling is taken, or refused with the
    reason and what to use instead). A run id is used once: a run that has ended, or that
    another job uses, is refused. Exit code: 0 on success, 1 when the job failed, 2 for usage
    and config errors (a finished or foreign run id included), 128+N after signal N.

    \b
    Defaults that differ from torchrun's:
      --max-restarts   3 (torchrun: 0), counted for the whole job, not per node
      --log-dir        runs/{run_id} (torchrun: a temporary directory)
      --rdzv-backend   memory for one node; static (--node-rank/--master-addr) is grpc here
      --rdzv-id        generated for one node (torchrun: "none"); required for several nodes

    \b
    Refused torchrun flags (each says why, and what to use instead): --run-path,
    --local-ranks-filter, --duplicate-stdout-filters, --duplicate-stderr-filters,
    --logs-specs, --numa-binding, --virtual-local-rank.
    """
    from rallypoint.agent.plan import NodeFacts, plan_job, route_targets
    from rallypoint.agent.torchrun_flags import static_node_env, torchrun_overrides
    from rallypoint.core.cli import plugin_manager
    from rallypoint.core.commands import _parse_set

    if as_json and not dry_run:
        raise click.UsageError("--json prints the plan of --dry-run: add --dry-run, or drop --json")
    _check_node_names(click.get_current_context(), node_id=node_id, host_name=host_name)
    warm = _warm_overrides(flags.pop("preload"), flags.pop("preload_keep"))
    script = list(args)
    job_file = script.pop(0) if script and script[0].endswith(".toml") else None
    flags, from_env, as_module, local_addr = _with_environment(flags, as_module, local_addr)
    _check_no_python(flags, script)
    overrides = [
        *torchrun_overrides(flags, os.environ, from_env),
        *_script_overrides(script, as_module, job_file),
        *_parse_set(set_values),
        *warm,
    ]
    pm = plugin_manager()
    resolved, launch = _resolve_in_environment(job_file, overrides, _endpoint(flags), pm)
    facts = NodeFacts.gather(
        job_file=job_file,
        script_from_cli=bool(script),
        host_name=host_name,
        node_id=node_id,
        local_addr=local_addr,
        route_to=route_targets(resolved),
        launch=launch,
    )
    if static_node_env(flags):  # static rendezvous: the env rank strategy reads the node rank from here
        facts = replace(facts, environ={**facts.environ, **static_node_env(flags)})
    plan = plan_job(resolved, facts)
    if dry_run:
        return _dry_run(resolved, plan, facts.address_note, as_json)
    _check_log_dir(plan.settings.log_dir, resolved.loaded.source_of("agent.log_dir"))
    return _start(plan, pm, facts.address_note)


def _start(plan: JobPlan, pm: RallypointPluginManager, note: str | None) -> int:
    """Join the rendezvous and run this node's agent until the job ends; its exit code."""
    from rallypoint.agent import console
    from rallypoint.agent.warm import WarmLauncher

    # with modules to preload, their imports begin now, while the rest of the agent loads, sets
    # up its rendezvous and joins it (inert without)
    settings = plan.settings
    warm = WarmLauncher(settings.preload, env=settings.preload_env, keep=settings.preload_keep)
    warm.start()
    try:
        from rallypoint.agent.agent import ElasticAgent
        from rallypoint.rendezvous.handler import RendezvousHandler

        handler = RendezvousHandler.from_spec(plan.rendezvous, plan.node, pm=pm)
        # from here on, nothing printed in this process may wait for a console that is not read
        console.capture_std_streams()
        elastic = ElasticAgent(handler, settings, pm=pm, warm=warm)
    except BaseException:
        warm.close()
        raise
    if note:
        elastic.say(note)
    return elastic.run().exit_code


def _warm_overrides(preload: str | None, keep: str | None) -> list[tuple[str, Any, str]]:
    """``--preload`` and ``--preload-keep`` as job keys (a flag not given is dropped by :func:`_resolve`)."""
    return [("agent.preload", preload, f"--preload {_FLAG}"), ("agent.preload_keep", keep, f"--preload-keep {_FLAG}")]


def _endpoint(flags: dict[str, Any]) -> str | None:
    """``--rdzv-endpoint`` as the backend takes it; ignored with ``--standalone``, as torchrun does."""
    from rallypoint.agent.torchrun_flags import endpoint_value

    return None if flags.get("standalone") else endpoint_value(flags, flags.get("rdzv_endpoint"))


def _check_no_python(flags: dict[str, Any], script: list[str]) -> None:
    """``--no-python`` runs the script as a command; a ``.py`` script always runs with Python here."""
    from rallypoint.agent.torchrun_flags import TorchrunRefused

    if flags.get("no_python") and script and script[0].endswith(".py"):
        raise TorchrunRefused(
            f"--no-python: {script[0]} is a .py file, which rallypoint always runs with Python; drop --no-python, "
            "or run it through a command (e.g. --no-python ./train.sh)"
        )


def _dry_run(resolved: ResolvedConfig, plan: JobPlan, address_note: str | None, as_json: bool) -> int:
    """``--dry-run``: the resolved job with the source of every value, then the plan this node would run."""
    from rallypoint.agent.plan_view import plan_data, render_plan
    from rallypoint.core.config import render_resolved
    from rallypoint.core.config.render import resolved_as_dict, resolved_sources

    data = plan_data(plan, address_note)
    if as_json:
        config = resolved_as_dict(resolved)
        plugins = config.pop("plugins", None)
        out = {"config": config, "sources": resolved_sources(resolved), "plugins": plugins, "plan": data}
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(render_resolved(resolved), nl=False)
        click.echo("\n" + render_plan(data), nl=False)
    return 0


@click.command()
@click.argument("job_file", required=False)
@click.option("--rdzv-backend", "--rdzv_backend", "rdzv_backend", metavar="NAME", help="Rendezvous backend.")
@click.option("--rdzv-endpoint", "--rdzv_endpoint", "rdzv_endpoint", metavar="VALUE", help="Backend endpoint.")
@click.option("--run-id", "--rdzv-id", "--rdzv_id", "run_id", metavar="ID", help="The job's run id.")
@click.option("--set", "-s", "set_values", multiple=True, metavar="KEY=VALUE", help="Override any job key.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the job as JSON (once, or one line per change with --watch)."
)
@click.option("--watch", "-w", is_flag=True, help="Redraw every --interval until the job ends.")
@click.option("--interval", type=float, default=1.0, show_default=True, metavar="SECONDS", help="--watch period.")
def status(
    job_file: str | None,
    rdzv_backend: str | None,
    rdzv_endpoint: str | None,
    run_id: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
    watch: bool,
    interval: float,
) -> int:
    """Show a job's rendezvous: round, nodes, per-rank state, restarts, failures, and how it ended.

    A closed job says whether it succeeded or failed (exit 0 either way; 1 when the backend
    holds nothing under the run id). --watch redraws the table until the job ends (on a
    terminal in place; otherwise each change is printed); --json prints the same as JSON.

    A one-node job on the memory backend is read from the status.json its agent writes: plain
    `rallypoint status`, in the directory the job ran from, shows the newest job under
    agent.log_dir (--run-id picks one).
    """
    from rallypoint.agent.config import NodesSection
    from rallypoint.agent.looking import looking_only
    from rallypoint.agent.status_view import render, snapshot
    from rallypoint.agent.torchrun_flags import endpoint_value
    from rallypoint.core.cli import plugin_manager
    from rallypoint.core.commands import _parse_set
    from rallypoint.rendezvous.config import RendezvousSection
    from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError
    from rallypoint.rendezvous.factory import backend_record, open_backend

    overrides: list[tuple[str, Any, str]] = []
    if rdzv_backend:
        backend_name = {"c10d": "grpc", "etcd-v2": "etcd"}.get(rdzv_backend, rdzv_backend)
        overrides.append(("rendezvous.backend", backend_name, f"--rdzv-backend {_FLAG}"))
    if run_id:
        overrides.append(("rendezvous.run_id", run_id, f"--run-id {_FLAG}"))
    overrides += _parse_set(set_values)
    pm = plugin_manager()
    endpoint = endpoint_value({"rdzv_backend": rdzv_backend}, rdzv_endpoint)
    resolved = _resolve(job_file, overrides, endpoint, pm)
    section, nodes = resolved.section(RendezvousSection), resolved.section(NodesSection)
    selection = resolved.selection("rendezvous.backend")
    assert selection is not None, "the rendezvous package declares rendezvous.backend"
    if not backend_record(selection).multi_host:  # the job's agent writes what status shows into its log directory
        return _status_from_file(resolved, section.run_id, as_json, watch, interval, limits="")
    if not section.run_id:
        raise click.UsageError("give the job's run id: --run-id ID (or rendezvous.run_id in the job file)")
    selection = looking_only(selection)  # status only reads, and never hosts the job's rendezvous server
    limits = f" (min {nodes.min}, max {nodes.max_nodes})" if job_file else ""
    run = section.run_id
    if watch:
        return _watch(_reader(selection, run), as_json, interval, limits)
    if _ended_here(resolved, run):  # a run id is used once: the job this agent served has ended
        return _status_from_file(resolved, run, as_json, watch=False, interval=interval, limits=limits)
    try:
        snap = snapshot(open_backend(selection, run), run)
        missing = f"run {run!r}: no rendezvous state (not started, or another backend/endpoint)"
    except RendezvousStateError as exc:  # a read-only backend finds no state for the run
        if not as_json:
            raise
        snap, missing = None, str(exc)
    except RendezvousBackendError:  # nothing answers: a server its agent hosted ended with the job
        if _status_file(resolved, run)[0] is None:
            raise
        snap = None
    if snap is None and _status_file(resolved, run)[0] is not None:  # its agent served the state, and ended
        return _status_from_file(resolved, run, as_json, watch=False, interval=interval, limits=limits)
    if snap is None:
        click.echo(json.dumps({"run_id": run, "found": False, "error": missing}) if as_json else missing)
        return 1
    click.echo(json.dumps(snap, indent=2) if as_json else render(snap, limits))
    return 0


def _ended_here(resolved: ResolvedConfig, run_id: str) -> bool:
    """Whether the ``status.json`` of ``run_id`` under ``agent.log_dir`` says the job ended."""
    from rallypoint.agent.status_file import read

    path, _ = _status_file(resolved, run_id)
    snap = read(path) if path is not None else None
    return bool(snap and snap.get("closed"))


def _status_file(resolved: ResolvedConfig, run_id: str | None) -> tuple[Path | None, list[Path]]:
    """The job's ``status.json`` under ``agent.log_dir`` (``run_id=None``: the newest), and all it matched."""
    from rallypoint.agent.config import AgentSection, JobSection
    from rallypoint.agent.plan import job_name
    from rallypoint.agent.status_file import find

    name = job_name(resolved.section(JobSection), resolved.loaded.path)
    return find(resolved.section(AgentSection).log_dir, run_id, name)


def _status_from_file(
    resolved: ResolvedConfig, run_id: str | None, as_json: bool, watch: bool, interval: float, limits: str
) -> int:
    """``status`` of a job whose rendezvous lived in its agent: the ``status.json`` that agent writes."""
    from rallypoint.agent.config import AgentSection
    from rallypoint.agent.status_file import read
    from rallypoint.agent.status_view import render

    path, found = _status_file(resolved, run_id)
    if path is None:
        where = resolved.section(AgentSection).log_dir
        missing = (
            f"no status.json under {where!r}"
            + (f" for run {run_id!r}" if run_id else "")
            + ": a job whose rendezvous lives in its agent (the memory backend, or c10d served by that agent) "
            "is shown from the status.json its agent writes into its log directory; run status in the directory "
            "the job ran from, or give --run-id and the job's agent.log_dir (--set agent.log_dir=DIR)"
        )
        click.echo(json.dumps({"run_id": run_id, "found": False, "error": missing}) if as_json else missing)
        return 1
    if watch:
        return _watch(lambda: read(path), as_json, interval, limits)
    snap = read(path)
    if snap is None:
        click.echo(f"{path}: not a status file rallypoint wrote (remove it)", err=True)
        return 1
    if as_json:
        click.echo(json.dumps({**snap, "source": str(path)}, indent=2))
        return 0
    click.echo(render(snap, limits))
    others = (
        f"; {len(found) - 1} older job(s) there: --run-id ID to choose" if run_id is None and len(found) > 1 else ""
    )
    click.echo(f"(from {path}, written by the job's agent{others})")
    return 0


def _reader(selection: Any, run_id: str) -> Any:
    """``--watch``'s read: ``None`` until the job's rendezvous state exists (a job not started yet)."""
    from rallypoint.agent.status_view import snapshot
    from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError
    from rallypoint.rendezvous.factory import open_backend

    opened: list[Any] = []

    def read() -> Any:
        try:
            if not opened:
                opened.append(open_backend(selection, run_id))
            return snapshot(opened[0], run_id)
        except RendezvousStateError:  # read-only backends refuse a run that has no state yet
            return None
        except RendezvousBackendError:  # no server yet: the agent that hosts it has not started
            return None

    return read


def _watch(read: Any, as_json: bool, interval: float, limits: str) -> int:
    """``status --watch``: redraw in place on a terminal, print each change otherwise (JSON: one line each)."""
    import sys

    from rallypoint.agent.status_view import watch

    tty = sys.stdout.isatty() and not as_json

    def show(text: str, changed: bool) -> None:
        if tty:
            click.echo("\x1b[H\x1b[2J" + text, nl=True)
        elif changed:
            click.echo(text + "\n")

    if as_json:
        last: list[str] = []

        def read_json() -> Any:
            snap = read()
            line = json.dumps(snap, separators=(",", ":"))
            if not last or line != last[-1]:
                click.echo(line)
                last.append(line)
            return snap

        watch(read_json, lambda _text, _changed: None, interval=max(interval, 0.05), limits=limits)
        return 0
    watch(read, show, interval=max(interval, 0.05), limits=limits)
    return 0
