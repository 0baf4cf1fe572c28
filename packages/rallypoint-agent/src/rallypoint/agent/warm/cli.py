"""``rallypoint warm list`` and ``rallypoint warm stop``: this user's kept warm processes on this node."""

from __future__ import annotations

import json
import time
from typing import Any

import click

__all__ = ["warm"]


def _describe(info: dict[str, Any]) -> str:
    age = time.time() - float(info.get("started", time.time()))
    state = "accepting" if info.get("accepting") else "stopping"
    return (
        f"pid {info.get('pid')}  {', '.join(info.get('modules', []))}  keep {float(info.get('keep', 0)):g} s  "
        f"up {age:.0f} s  {info.get('agents', 0)} agent(s), {info.get('workers', 0)} worker(s)  {state}\n"
        f"    python {info.get('python')}\n    socket {info.get('socket')}"
    )


@click.group()
def warm() -> None:
    """List or stop this user's kept warm processes on this node (agent.preload_keep)."""


@warm.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per warm process.")
def list_(as_json: bool) -> int:
    """List kept warm processes: pid, modules, keep, agents and workers attached."""
    from rallypoint.agent.warm.keep import kept_servers, runtime_dir

    found = kept_servers()
    for info in found:
        click.echo(json.dumps(info, sort_keys=True) if as_json else _describe(info))
    if not found and not as_json:
        click.echo(f"no kept warm process (in {runtime_dir()})")
    return 0


@warm.command()
@click.argument("pids", nargs=-1, type=int)
def stop(pids: tuple[int, ...]) -> int:
    """Stop kept warm processes (PIDS, or all of them).

    A stopped warm process takes no new job; it exits at once when idle, or as soon as the jobs
    whose workers it forked have ended (kill its pid to end those at once). Exit code 1 when
    none of the given PIDS is a kept warm process.
    """
    from rallypoint.agent.warm.keep import stop_kept

    stopped = stop_kept(pids)
    for info in stopped:
        busy = int(info.get("agents", 0))
        after = f"after its {busy} running job(s)" if busy > 0 else "now"
        click.echo(f"stopping warm process {info.get('pid')} ({', '.join(info.get('modules', []))}): exits {after}")
    if not stopped:
        click.echo("no kept warm process to stop" + (f" with pid {', '.join(map(str, pids))}" if pids else ""))
        if pids:
            raise click.exceptions.Exit(1)
    return 0
