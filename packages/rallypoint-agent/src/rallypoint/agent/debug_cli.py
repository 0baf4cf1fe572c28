"""``rallypoint debug stacks``: what every worker of a running job is doing, through its rendezvous backend.

A one-node job on the ``memory`` backend is read on its machine instead (:mod:`rallypoint.agent.debug_local`).
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import click

from rallypoint.agent.job_from_cli import resolve_running_job, running_job_options

__all__ = ["debug", "stacks"]


@click.group()
def debug() -> None:
    """Look inside a running job (no ssh: through its rendezvous backend)."""


@debug.command()
@running_job_options
@click.option("--json", "as_json", is_flag=True, help="Print every node's answer as JSON.")
@click.option(
    "--timeout", type=float, default=4.0, show_default=True, metavar="SECONDS", help="How long to wait for the nodes."
)
def stacks(
    job_file: str | None,
    rdzv_backend: str | None,
    rdzv_endpoint: str | None,
    run_id: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
    timeout: float,
) -> int:
    """Print the Python stack of every thread of every worker on every host, folded, with a diagnosis.

    Every agent of the run answers with its workers' stacks (dumped from a signal handler, so a
    worker stuck in C code answers too), their last collectives and their process states.
    Identical stacks are folded into one with their ranks; the odd ones come first, with host
    and pid. Exit 0 when every node answered, 1 otherwise.

    A one-node job on the memory backend is read on its machine: plain `rallypoint debug
    stacks`, in the directory the job ran from, finds the newest job under agent.log_dir
    (--run-id picks one).
    """
    from rallypoint.agent.debug_report import flatten, render
    from rallypoint.agent.debug_service import alive_nodes, gather, request
    from rallypoint.agent.looking import looking_only
    from rallypoint.core.cli import plugin_manager
    from rallypoint.rendezvous.config import RendezvousSection
    from rallypoint.rendezvous.errors import RendezvousStateError
    from rallypoint.rendezvous.factory import backend_record, open_backend

    pm = plugin_manager()
    resolved = resolve_running_job(job_file, rdzv_backend, rdzv_endpoint, run_id, set_values, pm)
    section = resolved.section(RendezvousSection)
    selection = resolved.selection("rendezvous.backend")
    assert selection is not None, "the rendezvous package declares rendezvous.backend"
    if not backend_record(selection).multi_host:  # one node: its workers are on this machine
        return _stacks_here(resolved, section.run_id, as_json, timeout)
    if not section.run_id:
        raise click.UsageError("give the job's run id: --run-id ID (or rendezvous.run_id in the job file)")
    started = time.monotonic()
    # a mistyped path or run id creates nothing: look first, write the request only to a running job;
    # and never host the job's rendezvous server (grpc, c10d)
    looking, selection = looking_only(selection), looking_only(selection, read_only=False)
    try:
        expect = alive_nodes(open_backend(looking, section.run_id))
    except RendezvousStateError as exc:
        click.echo(f"run {section.run_id!r}: {exc}", err=True)
        return 1
    if not expect:
        click.echo(f"run {section.run_id!r}: no node is running (no heartbeat in its rendezvous)", err=True)
        return 1
    backend = open_backend(selection, section.run_id)
    rid = request(backend, f"rallypoint debug stacks on {socket.gethostname()}")
    answers, missing = gather(backend, rid, timeout=timeout, expect=expect)
    took = time.monotonic() - started
    if as_json:
        doc = {"run_id": section.run_id, "request": rid, "seconds": round(took, 3), "missing": missing}
        doc["workers"] = flatten(answers)
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(render(answers, missing))
        n = len(flatten(answers))
        click.echo(f"({n} worker(s) on {len(answers)} node(s), {took:.2f}s)")
    return 1 if missing else 0


def _stacks_here(resolved: Any, run_id: str | None, as_json: bool, timeout: float) -> int:
    """``debug stacks`` of a job whose rendezvous lives in its agent: its workers, read on this machine."""
    from rallypoint.agent.config import AgentSection
    from rallypoint.agent.debug_local import latest_debug_dir, local_answer
    from rallypoint.agent.debug_report import flatten, render
    from rallypoint.agent.status_cli import job_status_file
    from rallypoint.agent.status_file import read

    started = time.monotonic()
    path, _ = job_status_file(resolved, run_id)
    if path is None:
        where = resolved.section(AgentSection).log_dir
        raise click.UsageError(
            f"no job found under {where!r}" + (f" for run {run_id!r}" if run_id else "") + ": a job whose rendezvous "
            "lives in its agent (the memory backend) is found through its log directory; run debug stacks on its "
            "machine, in the directory it ran from, or give --run-id and its agent.log_dir (--set agent.log_dir=DIR)"
        )
    snap = read(path) or {}
    run = str(snap.get("run_id") or run_id)
    if snap.get("closed"):
        click.echo(f"run {run!r}: no node is running ({snap.get('reason') or 'the job ended'})", err=True)
        return 1
    debug_dir = latest_debug_dir(path.parent)
    nodes = snap.get("nodes") or [{}]
    answer = local_answer(debug_dir, str(nodes[0].get("node_id") or "local")) if debug_dir is not None else None
    if answer is None or not answer["workers"]:
        click.echo(f"run {run!r}: no worker is running (in {path.parent})", err=True)
        return 1
    took = time.monotonic() - started
    if as_json:
        doc = {"run_id": run, "request": None, "seconds": round(took, 3), "missing": [], "workers": flatten([answer])}
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(render([answer], []))
        click.echo(f"({len(answer['workers'])} worker(s) on 1 node(s), {took:.2f}s)")
    return 0
