"""``rallypoint debug stacks``: what every worker of a running job is doing, through its rendezvous backend."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import replace

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
    """
    from rallypoint.agent.debug_report import flatten, render
    from rallypoint.agent.debug_service import alive_nodes, gather, request
    from rallypoint.core.cli import plugin_manager
    from rallypoint.rendezvous.config import RendezvousSection
    from rallypoint.rendezvous.errors import RendezvousStateError
    from rallypoint.rendezvous.factory import backend_record, open_backend

    pm = plugin_manager()
    resolved = resolve_running_job(job_file, rdzv_backend, rdzv_endpoint, run_id, set_values, pm)
    section = resolved.section(RendezvousSection)
    selection = resolved.selection("rendezvous.backend")
    assert selection is not None, "the rendezvous package declares rendezvous.backend"
    if not backend_record(selection).multi_host:
        raise click.UsageError(
            f"the {section.backend} backend lives inside one agent process; debug stacks needs a shared backend"
        )
    if not section.run_id:
        raise click.UsageError("give the job's run id: --run-id ID (or rendezvous.run_id in the job file)")
    started = time.monotonic()
    looking = selection
    if selection.options is not None and "read_only" in type(selection.options).model_fields:
        # a mistyped path or run id creates nothing: look first, write the request only to a running job
        looking = replace(selection, options=selection.options.model_copy(update={"read_only": True}))
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
