"""``rallypoint status``: a job's rendezvous as a table (or JSON), once or redrawn until the job ends.

A job whose rendezvous lives in a shared backend (file, gRPC served apart, etcd) is read from that
backend, read-only where the backend can be; one whose rendezvous lived in its agent (the memory
backend, c10d served by the agent) from the ``status.json`` that agent writes into its log directory
(:mod:`rallypoint.agent.status_file`). The table itself: :mod:`rallypoint.agent.status_view`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rallypoint.agent.job_from_cli import resolve_running_job, running_job_options

if TYPE_CHECKING:
    from rallypoint.core.config import ResolvedConfig

__all__ = ["job_status_file", "status"]


@click.command()
@running_job_options
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
    from rallypoint.core.cli import plugin_manager
    from rallypoint.rendezvous.config import RendezvousSection
    from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError
    from rallypoint.rendezvous.factory import backend_record, open_backend

    pm = plugin_manager()
    resolved = resolve_running_job(job_file, rdzv_backend, rdzv_endpoint, run_id, set_values, pm)
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
        if job_status_file(resolved, run)[0] is None:
            raise
        snap = None
    if snap is None and job_status_file(resolved, run)[0] is not None:  # its agent served the state, and ended
        return _status_from_file(resolved, run, as_json, watch=False, interval=interval, limits=limits)
    if snap is None:
        click.echo(json.dumps({"run_id": run, "found": False, "error": missing}) if as_json else missing)
        return 1
    click.echo(json.dumps(snap, indent=2) if as_json else render(snap, limits))
    return 0


def _ended_here(resolved: ResolvedConfig, run_id: str) -> bool:
    """Whether the ``status.json`` of ``run_id`` under ``agent.log_dir`` says the job ended."""
    from rallypoint.agent.status_file import read

    path, _ = job_status_file(resolved, run_id)
    snap = read(path) if path is not None else None
    return bool(snap and snap.get("closed"))


def job_status_file(resolved: ResolvedConfig, run_id: str | None) -> tuple[Path | None, list[Path]]:
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

    path, found = job_status_file(resolved, run_id)
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
