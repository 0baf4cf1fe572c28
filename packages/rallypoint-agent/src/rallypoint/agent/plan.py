"""Planning one node's run: from the resolved job and this node's facts to what the agent does.

:func:`plan_job` decides everything ``rallypoint run`` needs before the rendezvous starts: the
run id, the number of workers, the worker command line and environment, the log directory, the
node record this agent publishes, and how it joins the rendezvous. It is a pure function of its
two inputs (it reads the file system only to check the script exists and to read a node labels
file the environment names): the resolved job config, which it never edits, and a
:class:`NodeFacts` holding everything that is not config (host name, pid, environment, GPUs,
working directory, job file, flags that name this node). ``NodeFacts.gather()`` reads those from
the running process; tests build them by hand.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rallypoint.agent import worker_main
from rallypoint.agent.config import MAX_NPROC_PER_NODE, AgentSection, JobSection, NodesSection
from rallypoint.agent.debug_config import DebugSection
from rallypoint.agent.env import ROLE_ENV
from rallypoint.agent.launch import LaunchFacts, launch_settings
from rallypoint.agent.logs import parse_tee
from rallypoint.agent.netif import socket_ifname_env
from rallypoint.agent.node import node_record
from rallypoint.agent.ranks import DefaultStrategy, RankStrategy, load_strategy
from rallypoint.agent.records import RankStrategyRecord
from rallypoint.agent.settings import AgentSettings
from rallypoint.agent.warm import preload_problem, warm_environment
from rallypoint.core.config import PerWorker, ResolvedConfig
from rallypoint.core.errors import ConfigError, ConfigIssue, PluginError
from rallypoint.core.records import BackendRecord
from rallypoint.rendezvous.config import RendezvousSection
from rallypoint.rendezvous.factory import backend_record
from rallypoint.rendezvous.netif import interface_for_address, name_is_loopback, routable_address
from rallypoint.rendezvous.records import RendezvousBackendRecord
from rallypoint.rendezvous.spec import RendezvousSpec
from rallypoint.rendezvous.state import NodeInfo
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = [
    "JobPlan",
    "NodeFacts",
    "job_fingerprint",
    "plan_job",
    "rendezvous_endpoint",
    "route_targets",
    "visible_gpus",
    "worker_argv",
]

#: The in-process rendezvous backend: it gets a namespace per agent process, and the loopback address.
_MEMORY = "memory"


def visible_gpus(environ: Mapping[str, str], dev: Path = Path("/dev")) -> int:
    """GPUs this node would give workers, counted without importing torch.

    ``CUDA_VISIBLE_DEVICES`` wins when set (``-1`` and empty entries hide devices); otherwise
    the ``/dev/nvidia<N>`` device files are counted.
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(list(dev.glob("nvidia[0-9]*")))


@dataclass(frozen=True, kw_only=True)
class NodeFacts:
    """What planning reads about this node and this invocation, besides the job config.

    Attributes:
        host: the host name this node reports (``--host-name``, or the system's).
        pid: the agent's process id (default node id, memory backend namespace).
        environ: the agent's environment (node labels, scheduler variables).
        cwd: the working directory (scripts given without a job file are found from here).
        visible_gpus: GPUs visible to workers (``nproc_per_node = "auto"``).
        cpu_count: CPUs of this node (``"auto"`` without GPUs).
        job_file: the job file's absolute path, or ``None`` for a job from flags only.
        script_from_cli: the script came from the command line (relative to ``cwd``), not from
            ``job.entrypoint`` in the job file (relative to the job file's directory).
        node_id: this node's identity from ``--node-id``, or ``None`` for ``<host>-<pid>``.
        local_addr: the address other nodes reach this node at (``--local-addr``), or ``None``.
        local_interface: the network interface that holds ``local_addr`` (workers' Gloo and NCCL
            bind it), or ``None``.
        run_token: random text for a generated run id (``<job>-<token>``).
        executable: the Python interpreter that runs Python workers.
        address_note: how ``local_addr`` was found when no flag gave it (``--dry-run`` and the
            agent's first line say it), or why none could be: ``None`` when nothing was looked for.
        launch: what the launch environment that started the agent (Slurm, Kubernetes) tells of
            the job, or ``None`` (see :func:`~rallypoint.agent.launch.resolve_in_environment`).
    """

    host: str
    pid: int
    environ: Mapping[str, str] = field(default_factory=dict)
    cwd: Path = Path("/")
    visible_gpus: int = 0
    cpu_count: int = 1
    job_file: Path | None = None
    script_from_cli: bool = False
    node_id: str | None = None
    local_addr: str | None = None
    local_interface: str | None = None
    run_token: str = "0" * 8
    executable: str = sys.executable
    address_note: str | None = None
    launch: LaunchFacts | None = None

    @classmethod
    def gather(
        cls,
        *,
        job_file: str | os.PathLike[str] | None = None,
        script_from_cli: bool = False,
        host_name: str | None = None,
        node_id: str | None = None,
        local_addr: str | None = None,
        route_to: Sequence[str] | None = None,
        launch: LaunchFacts | None = None,
    ) -> NodeFacts:
        """Read the facts of the running process (the only impure step of planning).

        ``route_to``: when the job may span hosts (see :func:`route_targets`) and no
        ``local_addr`` is given, the hosts to find this node's routable address toward; it is
        looked for only when this host's own name resolves to loopback (other hosts could not
        use it, nor could Gloo here).
        """
        environ = dict(os.environ)
        host = host_name or socket.gethostname()
        note = None
        if local_addr is None and route_to is not None and name_is_loopback(socket.gethostname()):
            route = routable_address(route_to)
            if route is not None:
                local_addr = route.address
                note = f"this node's address {route.address} is {route.how} (its host name resolves to loopback)"
            else:
                note = (
                    f"this host's name {socket.gethostname()!r} resolves to loopback and no single address "
                    "other hosts could reach was found: give --local-addr ADDRESS (the address other hosts "
                    "reach this one at), or workers on other hosts will not reach this one"
                )
        return cls(
            host=host,
            pid=os.getpid(),
            environ=environ,
            cwd=Path.cwd(),
            visible_gpus=visible_gpus(environ),
            cpu_count=os.cpu_count() or 1,
            job_file=Path(job_file).resolve() if job_file is not None else None,
            script_from_cli=script_from_cli,
            node_id=node_id,
            local_addr=local_addr,
            local_interface=interface_for_address(local_addr) if local_addr else None,
            run_token=uuid.uuid4().hex[:8],
            executable=sys.executable,
            address_note=note,
            launch=launch,
        )


@dataclass(frozen=True)
class JobPlan:
    """What :func:`plan_job` decided for one node.

    Attributes:
        node: the record this node publishes in the rendezvous.
        settings: everything the elastic agent needs besides its rendezvous handler.
        rendezvous: how this node joins the rendezvous (opened with
            :meth:`~rallypoint.rendezvous.handler.RendezvousHandler.from_spec`).
        launch: the launch environment's facts the plan was made with (``NodeFacts.launch``).
    """

    node: NodeInfo
    settings: AgentSettings
    rendezvous: RendezvousSpec
    launch: LaunchFacts | None = None


def _issue(source: str | None, key: str, message: str) -> ConfigError:
    return ConfigError([ConfigIssue(source, key, message)])


def worker_argv(
    job: JobSection, *, script_from_cli: bool, base: Path, cwd: Path, executable: str, source: str | None = None
) -> list[str]:
    """The worker command line: Python scripts and modules run with ``executable``, unbuffered.

    A Python script or module runs through :mod:`rallypoint.agent.worker_main`
    (``python -u .../worker_main.py train.py ARGS``), which runs it as ``python`` would and ends
    the worker without the interpreter's finalization; any other program runs as it is.

    Args:
        job: the ``[job]`` section (``entrypoint`` or ``module``, ``args``).
        script_from_cli: the entrypoint came from the command line, so a relative path stays
            relative to the working directory; one from the job file is made absolute from ``base``.
        base: the job file's directory, or the working directory without a job file.
        cwd: the working directory (where the workers start).
        executable: the Python interpreter.
        source: where ``job.entrypoint`` was set, for the error message.

    Raises:
        ConfigError: a ``.py`` entrypoint does not exist.
    """
    args = list(job.args)
    if job.module:
        return worker_main.command(executable, job.module, args, module=True)
    entry = str(job.entrypoint)
    path = Path(entry)
    if not script_from_cli and not path.is_absolute():
        path = base / path
    on_disk = path if path.is_absolute() else cwd / path
    if path.suffix == ".py":
        if not on_disk.exists():
            raise _issue(source, "job.entrypoint", f"no such script: {path}")
        return worker_main.command(executable, str(path), args)
    if path.is_absolute() or "/" in entry:
        return [str(path) if path.is_absolute() else entry, *args]
    # a bare name ("hostname") is looked up on PATH, unless a file of that name is right here
    return [f"./{entry}" if on_disk.is_file() else entry, *args]


def job_name(job: JobSection, job_file: Path | None) -> str:
    """The job's name (``{job}``, the generated run id): ``job.name``, else the file's stem, else ``job``."""
    return job.name or (job_file.stem if job_file is not None else None) or "job"


def job_fingerprint(job: JobSection, nodes: NodesSection) -> dict[str, Any]:
    """What every node of one job runs, as JSON: two jobs that differ here never share a run id.

    The entry point (or module) as written, the workers' arguments and the node range. The
    number of workers per node is left out (nodes may differ), and so are paths that depend on
    where a node keeps the job file.
    """
    return {
        "entrypoint": job.entrypoint,
        "module": job.module,
        "args": list(job.args),
        "nodes": f"{nodes.min}:{nodes.max_nodes}",
    }


def _rendezvous_plan(resolved: ResolvedConfig, facts: NodeFacts, job_name: str) -> RendezvousSpec:
    """Check the backend fits the node range, settle the run id and this run's backend options."""
    nodes = resolved.section(NodesSection)
    section = resolved.section(RendezvousSection)
    source = resolved.loaded.source_of("rendezvous.backend")
    selection = resolved.selection("rendezvous.backend")
    record = selection.record if selection is not None else None
    if selection is None or not isinstance(record, RendezvousBackendRecord):
        raise _issue(source, "rendezvous.backend", f"{section.backend!r} is not a rendezvous backend")
    max_key = "nodes.max" if nodes.max is not None else "nodes.min"
    max_source = resolved.loaded.source_of(max_key)
    if nodes.max_nodes > 1 and not record.multi_host:
        raise _issue(
            max_source if source == "default" else source,
            max_key if source == "default" else "rendezvous.backend",
            f"backend {section.backend!r} only works within one agent process ({source}), but {max_key} is "
            f"{nodes.max_nodes} ({max_source}); use a shared backend such as 'file' "
            "(--rdzv-backend file --rdzv-endpoint DIR)",
        )
    run_id = section.run_id
    if run_id is None:
        if nodes.max_nodes > 1:
            raise _issue(
                max_source,
                "rendezvous.run_id",
                f"a multi-node job needs a run id that every node shares ({max_key} is {nodes.max_nodes}): "
                "set rendezvous.run_id or pass --run-id",
            )
        run_id = f"{job_name}-{facts.run_token}"
    options = selection.options
    if record.name == _MEMORY and options is not None and "namespace" in type(options).model_fields:
        # two single-node jobs on one host (or in one process) must not share a rendezvous
        options = options.model_copy(update={"namespace": f"run-{facts.pid}"})
        selection = dataclasses.replace(selection, options=options)
    fingerprint = job_fingerprint(resolved.section(JobSection), nodes)
    role = resolved.section(AgentSection).role
    if role != "default":  # nodes of one job share a role: one with another is refused as another job
        fingerprint["role"] = role
    return RendezvousSpec(
        backend=selection,
        run_id=run_id,
        min_nodes=nodes.min,
        max_nodes=nodes.max_nodes,
        timeouts=RendezvousTimeouts.from_section(section),
        fingerprint=fingerprint,
    )


def rendezvous_endpoint(plan: RendezvousSpec) -> str:
    """The rendezvous backend as messages name it: ``'grpc' backend at 10.0.0.1:29400``.

    The value of the option ``--rdzv-endpoint`` sets (the backend record's ``endpoint_option``);
    a backend without one is named alone (``'memory' backend``).
    """
    record = plan.record
    option = record.endpoint_option
    value = getattr(plan.backend.options, option, None) if option else None
    if isinstance(value, list | tuple):  # several endpoints (etcd's cluster members)
        value = ", ".join(str(v) for v in value)
    return f"{record.name!r} backend at {value}" if value else f"{record.name!r} backend"


def route_targets(resolved: ResolvedConfig) -> list[str] | None:
    """Hosts this node's address must reach, when the job may span hosts; ``None`` when it cannot.

    The rendezvous endpoint's hosts (``'grpc'``: its ``HOST:PORT``; ``'etcd'``: every member's
    URL); ``[]`` for a job across hosts whose backend has no network endpoint (``'file'``).
    ``None`` for a single-node job or an in-process backend: loopback is right there.
    """
    nodes = resolved.section(NodesSection)
    selection = resolved.selection("rendezvous.backend")
    if nodes.max_nodes <= 1 or selection is None:
        return None
    record = backend_record(selection)
    if not record.multi_host:
        return None
    option = record.endpoint_option
    value = getattr(selection.options, option, None) if option else None
    values = value if isinstance(value, list | tuple) else [value] if value else []
    return [host for v in values if (host := _endpoint_host(str(v))) is not None]


def _endpoint_host(value: str) -> str | None:
    """The host of ``HOST:PORT``, ``[IPv6]:PORT`` or ``scheme://HOST:PORT``; ``None`` for anything else (a path)."""
    text = value.strip().split("://", 1)[-1].split("/", 1)[0]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _worker_env(resolved: ResolvedConfig, facts: NodeFacts, job: JobSection) -> dict[str, str]:
    """Variables every worker gets on top of the torchrun ones; ``[job] env`` wins over ours.

    Each section the job has contributes what its package declares (``ConfigSection.worker_env``:
    the collectives backend, the timeline config, the ``[rpc]`` settings...): the agent hands
    them over without knowing them. Relative paths are taken from the job file's directory, else
    the working directory.
    """
    env: dict[str, str] = {}
    base = facts.job_file.parent if facts.job_file is not None else facts.cwd
    for declared in resolved.loaded.schema.sections:
        if declared.worker_env is not None and getattr(resolved.config, declared.name, None) is not None:
            env.update(declared.worker_env(resolved, base))
    if facts.job_file is not None:
        env["RALLYPOINT_CONFIG"] = str(facts.job_file)
    # workers bind the interface of the agent's --local-addr, not whatever the host name resolves to
    env.update(socket_ifname_env(facts.local_interface, {**facts.environ, **job.env}))
    return {**env, **job.env}


def _line_prefix(resolved: ResolvedConfig, agent: AgentSection, facts: NodeFacts) -> str:
    """``agent.line_prefix`` as a template; torchrun's variable when the job does not set it."""
    from rallypoint.agent.line_prefix import TORCHRUN_ENV, check, from_torchrun

    if resolved.loaded.source_of("agent.line_prefix", inherit=False) == "default":
        try:
            torchrun = from_torchrun(facts.environ)
        except ValueError as exc:
            raise _issue(f"{TORCHRUN_ENV} (environment)", "agent.line_prefix", str(exc)) from None
        if torchrun is not None:
            return torchrun
    return check(agent.line_prefix)


def _shared(worker_env: Mapping[str, str]) -> dict[str, str]:
    """The variables every worker shares (the warm process gets them): per-worker templates left out."""
    return {k: v for k, v in worker_env.items() if not isinstance(v, PerWorker)}


def _log_dir(resolved: ResolvedConfig, template: str, run_id: str, job_name: str) -> Path:
    try:
        return Path(template.format(run_id=run_id, job=job_name))
    except (KeyError, IndexError, ValueError) as exc:
        raise _issue(
            resolved.loaded.source_of("agent.log_dir"),
            "agent.log_dir",
            f"cannot fill in {template!r} ({type(exc).__name__}: {exc}); use {{run_id}} and {{job}} only, "
            "and double braces for literal ones",
        ) from None


def _auto_nproc(resolved: ResolvedConfig, facts: NodeFacts) -> int:
    """``nproc_per_node = "auto"``: visible GPUs, else CPUs, within the bound a number would have."""
    count = int(facts.visible_gpus or facts.cpu_count)
    if count > MAX_NPROC_PER_NODE:
        what = "GPUs (CUDA_VISIBLE_DEVICES)" if facts.visible_gpus else "CPUs"
        raise _issue(
            resolved.loaded.source_of("nodes.nproc_per_node"),
            "nodes.nproc_per_node",
            f'"auto" found {count} {what}, more than the {MAX_NPROC_PER_NODE} workers a node may run; '
            "give a number instead",
        )
    return count


def _selected(resolved: ResolvedConfig, key: str) -> tuple[BackendRecord | None, BaseModel | None]:
    selection = resolved.selection(key)
    if selection is None:
        return None, None
    return selection.record, selection.options


def _rank_strategy(resolved: ResolvedConfig) -> tuple[RankStrategy, str, BaseModel | None]:
    """The job's rank strategy, loaded once (its requirements checked), its name and its validated options.

    Without the ranks kind in the config (no ``[ranks]`` section declared) the strategy is
    torchrun's (:class:`~rallypoint.agent.ranks.DefaultStrategy`).

    Raises:
        ConfigError: the strategy cannot be loaded (a requirement missing, a broken factory),
            named with the key that selected it.
    """
    selection = resolved.selection("ranks.strategy")
    record = selection.record if selection is not None else None
    if selection is None or not isinstance(record, RankStrategyRecord):
        return DefaultStrategy(), "default", None
    try:
        strategy = load_strategy(record)
    except PluginError as exc:
        raise _issue(resolved.loaded.source_of("ranks.strategy"), "ranks.strategy", str(exc)) from None
    return strategy, record.name, selection.options


def _torchrun_worker_env(agent: AgentSection) -> tuple[dict[str, str], dict[str, str]]:
    """What torchrun tells its workers of the agent: the signals it handles, and its role.

    ``[job] env`` may override the first; the role (when not the default) wins, as the
    rendezvous checks it.
    """
    role = {ROLE_ENV: agent.role} if agent.role != "default" else {}
    return {"TORCHELASTIC_SIGNALS_TO_HANDLE": agent.signals_to_handle}, role


def _worker_command(
    resolved: ResolvedConfig, facts: NodeFacts, job: JobSection, agent: AgentSection, launch_env: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """What each worker runs (its command line) and the environment every worker shares.

    The launch environment's variables come after torchrun's signal list and before what the
    job's sections declare; the role comes last, as the rendezvous checks it.

    Raises:
        ConfigError: a missing script, or ``agent.preload`` with a command it cannot preload.
    """
    argv = worker_argv(
        job,
        script_from_cli=facts.script_from_cli,
        base=facts.job_file.parent if facts.job_file is not None else facts.cwd,
        cwd=facts.cwd,
        executable=facts.executable,
        source=resolved.loaded.source_of("job.entrypoint"),
    )
    if agent.preload and (problem := preload_problem(argv)):
        raise _issue(resolved.loaded.source_of("agent.preload"), "agent.preload", problem)
    signals_env, role_env = _torchrun_worker_env(agent)
    return argv, {**signals_env, **launch_env, **_worker_env(resolved, facts, job), **role_env}


def plan_job(resolved: ResolvedConfig, facts: NodeFacts) -> JobPlan:
    """Plan this node's run of a resolved job. Pure: the same inputs give the same plan.

    Decides the job name (``job.name``, else the job file's stem, else ``"job"``), the run id
    (``rendezvous.run_id``, else ``<name>-<token>`` for a single-node job), the number of local
    workers (``"auto"``: visible GPUs, else CPUs), the worker command line and environment
    (what each section of the job declares for workers, ``RALLYPOINT_CONFIG``, ``[job] env``), the log
    directory, this node's rendezvous record and the rendezvous backend's options for this run,
    the rank strategy (loaded here, once), and the agent's torchrun settings (the signals it
    handles, the shutdown grace, the role). ``resolved`` is not modified.

    Raises:
        ConfigError: nothing to run, a missing script, a single-process backend for a multi-node
            job, a multi-node job without a run id, a log directory template that does not fit,
            or a rank strategy that cannot be loaded.
        NodeLabelsError: the node labels (``RALLYPOINT_NODE_LABELS`` or its file) are invalid.
    """
    job = resolved.section(JobSection)
    agent = resolved.section(AgentSection)
    if not job.entrypoint and not job.module:
        raise _issue(
            None, "job.entrypoint", "nothing to run: give SCRIPT [ARGS...], or set job.entrypoint or job.module"
        )
    name = job_name(job, facts.job_file)
    rendezvous = _rendezvous_plan(resolved, facts, name)
    nproc = resolved.section(NodesSection).nproc_per_node
    handled = tuple(signal.Signals[name] for name in agent.signals_to_handle.split(","))
    launch = launch_settings(facts.launch, handled)
    node = node_record(
        host=facts.host,
        addr=facts.local_addr or ("127.0.0.1" if rendezvous.record.name == _MEMORY else facts.host),
        local_world_size=_auto_nproc(resolved, facts) if nproc == "auto" else int(nproc),
        environ=facts.environ,
        node_id=facts.node_id or launch.node_id,
        pid=facts.pid,
    )
    strategy, strategy_name, strategy_options = _rank_strategy(resolved)
    watchdog, watchdog_options = _selected(resolved, "timer.watchdog")
    argv, worker_env = _worker_command(resolved, facts, job, agent, launch.worker_env)
    settings = AgentSettings(
        argv=argv,
        run_id=rendezvous.run_id,
        host=facts.host,
        max_restarts=agent.max_restarts,
        monitor_interval=agent.monitor_interval,
        exit_barrier_timeout=agent.exit_barrier_timeout,
        log_dir=_log_dir(resolved, agent.log_dir, rendezvous.run_id, name),
        tee=parse_tee(agent.tee),
        line_prefix=_line_prefix(resolved, agent, facts),
        worker_env=worker_env,
        strategy=strategy,
        strategy_name=strategy_name,
        strategy_options=strategy_options,
        stop_grace=agent.shutdown_timeout,
        signals=handled,
        notice_signals=launch.notice_signals,
        ignored_signals=launch.ignored_signals,
        restarts_before=launch.restarts_before,
        fixed_allocation=launch.fixed_allocation,
        watchdog=watchdog,
        watchdog_options=watchdog_options,
        store_head_start=agent.store_head_start,
        preload=tuple(agent.preload),
        preload_env=(
            warm_environment(facts.environ, _shared(worker_env), node.local_world_size) if agent.preload else None
        ),
        preload_keep=agent.preload_keep,
        rendezvous_endpoint=rendezvous_endpoint(rendezvous),
        hang_timeout=resolved.section(DebugSection).hang_timeout,
    )
    return JobPlan(node, settings, rendezvous, facts.launch)
