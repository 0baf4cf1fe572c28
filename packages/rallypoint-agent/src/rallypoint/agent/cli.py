"""``rallypoint run`` and ``rallypoint status``.

``rallypoint run`` takes a job file, torchrun-style flags, or both::

    rallypoint run job.toml
    rallypoint run --nproc-per-node 2 train.py --lr 0.1
    rallypoint run job.toml --nnodes 2:4 --rdzv-backend file --rdzv-endpoint /shared/rdzv --run-id exp1

Flags are applied over the file (and over ``RALLYPOINT_*`` variables), like ``--set KEY=VALUE``.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import click

from rallypoint.core.errors import ConfigError, ConfigIssue

__all__ = ["run", "status"]

_FLAG = "(command line)"


def _nnodes(value: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", value)
    if not m:
        raise ConfigError([ConfigIssue(f"--nnodes {_FLAG}", "nodes", f"expected N or MIN:MAX, got {value!r}")])
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) else low
    return low, high


def _config_error(source: str | None, key: str, message: str) -> ConfigError:
    return ConfigError([ConfigIssue(source, key, message)])


def _visible_gpus() -> int:
    """GPUs this node would give workers, counted without importing torch."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len([p for p in Path("/dev").glob("nvidia[0-9]*")])


def _overrides(**flags: Any) -> list[tuple[str, Any, str]]:
    out: list[tuple[str, Any, str]] = []

    def add(key: str, value: Any, flag: str) -> None:
        out.append((key, value, f"{flag} {_FLAG}"))

    if flags["standalone"]:
        add("rendezvous.backend", "memory", "--standalone")
        add("nodes.min", 1, "--standalone")
        add("nodes.max", 1, "--standalone")
    if flags["nproc_per_node"] is not None:
        value: Any = flags["nproc_per_node"]
        add("nodes.nproc_per_node", int(value) if value.isdigit() else value, "--nproc-per-node")
    if flags["nnodes"] is not None:
        low, high = _nnodes(flags["nnodes"])
        add("nodes.min", low, "--nnodes")
        add("nodes.max", high, "--nnodes")
    if flags["rdzv_backend"] is not None:
        add("rendezvous.backend", flags["rdzv_backend"], "--rdzv-backend")
    if flags["run_id"] is not None:
        add("rendezvous.run_id", flags["run_id"], "--run-id")
    if flags["max_restarts"] is not None:
        add("agent.max_restarts", flags["max_restarts"], "--max-restarts")
    if flags["monitor_interval"] is not None:
        add("agent.monitor_interval", flags["monitor_interval"], "--monitor-interval")
    if flags["log_dir"] is not None:
        add("agent.log_dir", flags["log_dir"], "--log-dir")
    if flags["tee"] is not None:
        tee = flags["tee"]
        add("agent.tee", [int(x) for x in tee.split(",")] if re.fullmatch(r"[\d,]+", tee) else tee, "--tee")
    return out


def _endpoint_override(resolved_backend: str, endpoint: str, pm: Any) -> tuple[str, Any, str]:
    from rallypoint.core.registry import RENDEZVOUS_BACKENDS

    record = pm.registry(RENDEZVOUS_BACKENDS).get(resolved_backend, where="rendezvous.backend")
    option = getattr(record, "endpoint_option", None)
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


def _worker_argv(job: Any, script_from_cli: bool, base: Path) -> list[str]:
    """The worker command line: Python scripts run with this interpreter, unbuffered."""
    args = list(job.args)
    if job.module:
        return [sys.executable, "-u", "-m", job.module, *args]
    entry = str(job.entrypoint)
    path = Path(entry)
    if not script_from_cli and not path.is_absolute():
        path = base / path
    if path.suffix == ".py":
        if not path.exists():
            where = "the command line" if script_from_cli else "job.entrypoint"
            raise ConfigError([ConfigIssue(where, "job.entrypoint", f"no such script: {path}")])
        return [sys.executable, "-u", str(path), *args]
    return [str(path) if ("/" in entry or path.exists()) else entry, *args]


@click.command(context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False})
@click.option("--nproc-per-node", metavar="N|auto", help="Workers on this node (nodes.nproc_per_node).")
@click.option("--nnodes", metavar="N|MIN:MAX", help="Number of nodes, or an elastic range (nodes.min/max).")
@click.option("--rdzv-backend", metavar="NAME", help="Rendezvous backend (rendezvous.backend).")
@click.option("--rdzv-endpoint", metavar="VALUE", help="Backend endpoint, e.g. a directory for 'file'.")
@click.option("--run-id", "--rdzv-id", "run_id", metavar="ID", help="Job identity shared by every node.")
@click.option("--max-restarts", type=int, metavar="N", help="Job-wide restart budget (agent.max_restarts).")
@click.option("--monitor-interval", metavar="DURATION", help="How often the rendezvous is checked, e.g. 100ms.")
@click.option("--log-dir", metavar="DIR", help="Logs, error files and failure.json (agent.log_dir).")
@click.option("--tee", metavar="all|rank0|none|R,R", help="Which ranks reach the console (agent.tee).")
@click.option("--standalone", is_flag=True, help="Single node, in-process rendezvous (backend memory).")
@click.option("-m", "--module", "as_module", is_flag=True, help="Run SCRIPT as a Python module (python -m).")
@click.option(
    "--local-addr",
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
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(
    args: tuple[str, ...],
    set_values: tuple[str, ...],
    as_module: bool,
    local_addr: str | None,
    node_id: str | None,
    host_name: str | None,
    rdzv_endpoint: str | None,
    **flags: Any,
) -> int:
    """Run a job: [JOB.toml] [SCRIPT [ARGS...]].

    Rendezvous with the other nodes, assign ranks, start the workers with the torchrun
    environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), restart them on failure within
    the job-wide budget, and print one root-cause report if the job fails. With no job file,
    SCRIPT is required; a torchrun command line works with `rallypoint run` in place of
    `torchrun`. Exit code: 0 on success, 1 when the job failed, 2 for usage and config errors.
    """
    from rallypoint.agent.agent import AgentSettings, ElasticAgent
    from rallypoint.agent.env import scheduler_env
    from rallypoint.agent.ranks import read_node_labels
    from rallypoint.core.cli import plugin_manager
    from rallypoint.core.commands import _parse_set
    from rallypoint.core.config import load_job_config, resolve_config
    from rallypoint.rendezvous.handler import RendezvousHandler
    from rallypoint.rendezvous.state import NodeInfo

    rest = list(args)
    job_file = rest.pop(0) if rest and rest[0].endswith(".toml") else None
    overrides = _overrides(**flags)
    if rest:
        key = "job.module" if as_module else "job.entrypoint"
        overrides += [(key, rest[0], f"SCRIPT {_FLAG}"), ("job.args", rest[1:], f"ARGS {_FLAG}")]
        if as_module:
            overrides.append(("job.entrypoint", None, f"-m {_FLAG}"))
        elif job_file:
            overrides.append(("job.module", None, f"SCRIPT {_FLAG}"))
    overrides += _parse_set(set_values)
    overrides = [o for o in overrides if o[1] is not None]
    pm = plugin_manager()
    loaded = load_job_config(job_file, overrides=overrides)
    if rdzv_endpoint is not None:
        overrides.append(_endpoint_override(loaded.config.rendezvous.backend, rdzv_endpoint, pm))
        loaded = load_job_config(job_file, overrides=overrides)
    resolved = resolve_config(loaded, pm)
    cfg = loaded.config
    job = cfg.job
    if not job.entrypoint and not job.module:
        raise click.UsageError(
            "nothing to run: give SCRIPT [ARGS...], or set job.entrypoint or job.module in a job file"
        )
    rdzv_record = resolved.selections["rendezvous.backend"].record
    if cfg.nodes.max_nodes > 1 and rdzv_record is not None and not getattr(rdzv_record, "multi_host", True):
        raise _config_error(
            loaded.source_of("rendezvous.backend"),
            "rendezvous.backend",
            f"backend {cfg.rendezvous.backend!r} only works within one agent process, but nodes.max is "
            f"{cfg.nodes.max_nodes}; use a shared backend such as 'file' "
            "(--rdzv-backend file --rdzv-endpoint DIR)",
        )
    if cfg.rendezvous.run_id is None:
        if cfg.nodes.max_nodes > 1:
            raise _config_error(
                None,
                "rendezvous.run_id",
                "a multi-node job needs a run id that every node shares: set rendezvous.run_id or pass --run-id",
            )
        cfg.rendezvous.run_id = f"{job.name or 'job'}-{uuid.uuid4().hex[:8]}"
    run_id = cfg.rendezvous.run_id
    nproc = cfg.nodes.nproc_per_node
    if nproc == "auto":
        nproc = _visible_gpus() or (os.cpu_count() or 1)
    base = Path(job_file).resolve().parent if job_file else Path.cwd()
    argv = _worker_argv(job, script_from_cli=bool(rest), base=base)

    memory = cfg.rendezvous.backend == "memory"
    host = host_name or __import__("socket").gethostname()
    node = NodeInfo(
        node_id=node_id or f"{host}-{os.getpid()}",
        host=host,
        addr=local_addr or ("127.0.0.1" if memory else host),
        local_world_size=int(nproc),
        labels=read_node_labels(os.environ, os.environ.get("RALLYPOINT_NODE_LABELS_FILE")),
        env=scheduler_env(),
    )
    if memory:
        cfg.rendezvous.options = {**cfg.rendezvous.options, "namespace": f"run-{os.getpid()}"}
    handler = RendezvousHandler.from_config(
        cfg.rendezvous, node, min_nodes=cfg.nodes.min, max_nodes=cfg.nodes.max_nodes, pm=pm
    )
    worker_env = {
        "RALLYPOINT_COLLECTIVES_BACKEND": cfg.collectives.backend,
        "RALLYPOINT_COLLECTIVES_TIMEOUT": f"{cfg.collectives.timeout:g}",
        **({"RALLYPOINT_CONFIG": str(Path(job_file).resolve())} if job_file else {}),
        **job.env,
    }
    ranks_sel = resolved.selections.get("ranks.strategy")
    timer_sel = resolved.selections.get("timer.watchdog")
    settings = AgentSettings(
        argv=argv,
        run_id=run_id,
        max_restarts=cfg.agent.max_restarts,
        monitor_interval=cfg.agent.monitor_interval,
        exit_barrier_timeout=cfg.agent.exit_barrier_timeout,
        log_dir=Path(cfg.agent.log_dir.format(run_id=run_id, job=job.name or "job")),
        tee=cfg.agent.tee,
        worker_env=worker_env,
        strategy=ranks_sel.record if ranks_sel and ranks_sel.record else None,
        strategy_options=ranks_sel.options if ranks_sel else None,
        watchdog=timer_sel.record if timer_sel and timer_sel.record else None,
        watchdog_options=timer_sel.options if timer_sel else None,
        timeline=cfg.timer.timeline,
        store_head_start=cfg.agent.store_head_start,
    )
    agent = ElasticAgent(handler, settings, pm=pm)
    agent.host = host
    result = agent.run()
    return result.exit_code


@click.command()
@click.argument("job_file", required=False)
@click.option("--rdzv-backend", metavar="NAME", help="Rendezvous backend (rendezvous.backend).")
@click.option("--rdzv-endpoint", metavar="VALUE", help="Backend endpoint, e.g. a directory for 'file'.")
@click.option("--run-id", "--rdzv-id", "run_id", metavar="ID", help="The job's run id.")
@click.option("--set", "-s", "set_values", multiple=True, metavar="KEY=VALUE", help="Override any job key.")
def status(
    job_file: str | None,
    rdzv_backend: str | None,
    rdzv_endpoint: str | None,
    run_id: str | None,
    set_values: tuple[str, ...],
) -> int:
    """Show a running job's rendezvous: round, members, nodes waiting, restarts, failures."""
    from rallypoint.core.cli import plugin_manager
    from rallypoint.core.commands import _parse_set
    from rallypoint.core.config import load_job_config
    from rallypoint.rendezvous.handler import open_backend
    from rallypoint.rendezvous.state import HEADER_KEY, Header, count_key

    overrides: list[tuple[str, Any, str]] = []
    if rdzv_backend:
        overrides.append(("rendezvous.backend", rdzv_backend, f"--rdzv-backend {_FLAG}"))
    if run_id:
        overrides.append(("rendezvous.run_id", run_id, f"--run-id {_FLAG}"))
    overrides += _parse_set(set_values)
    pm = plugin_manager()
    loaded = load_job_config(job_file, overrides=overrides)
    if rdzv_endpoint is not None:
        overrides.append(_endpoint_override(loaded.config.rendezvous.backend, rdzv_endpoint, pm))
        loaded = load_job_config(job_file, overrides=overrides)
    cfg = loaded.config
    if cfg.rendezvous.backend == "memory":
        raise click.UsageError("the memory backend lives inside one agent process; status needs a shared backend")
    if not cfg.rendezvous.run_id:
        raise click.UsageError("give the job's run id: --run-id ID (or rendezvous.run_id in the job file)")
    backend = open_backend(cfg.rendezvous, pm)
    entry = backend.get(HEADER_KEY)
    if entry is None and backend.get(count_key(0)) is None:
        click.echo(f"run {cfg.rendezvous.run_id!r}: no rendezvous state (not started, or another backend/endpoint)")
        return 1
    header = Header.from_json(entry.value) if entry is not None else Header()  # round 0 still gathering
    restarts = backend.get("agent/restarts")
    failures = backend.list("agent/failures/")
    joined = backend.get(count_key(header.round))
    waiting = backend.get(count_key(header.round + 1))
    state = "closed" if header.closed else ("running" if header.complete else "gathering nodes")
    click.echo(f"run:       {cfg.rendezvous.run_id}")
    click.echo(f"round:     {header.round} ({state})")
    if header.complete:
        click.echo(f"members:   {len(header.participants)}")
        for rank, member in enumerate(header.participants):
            click.echo(f"  {rank}: {member.node_id}")
        click.echo(f"waiting:   {int(waiting.value) if waiting else 0}")
    else:
        limits = f" (min {cfg.nodes.min}, max {cfg.nodes.max_nodes})" if job_file else ""
        click.echo(f"joined:    {int(joined.value) if joined else 0}{limits}")
    click.echo(f"restarts:  {int(restarts.value) if restarts else 0}")
    click.echo(f"failures:  {len(failures)}")
    return 0
