"""``rallypoint timeline``: merge the per-worker event logs of a run, and report per step."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rallypoint.timer.merge import Timeline

__all__ = ["timeline"]


def _load(run_dirs: tuple[Path, ...]) -> Timeline:
    from rallypoint.core.errors import RallypointError
    from rallypoint.timer.merge import find_logs, merge_logs

    if not find_logs(run_dirs):
        where = ", ".join(map(str, run_dirs))
        raise RallypointError(
            f"no timeline logs (rank_*.jsonl) under {where}; run the job with [timer] timeline = true, "
            "or set RALLYPOINT_TIMELINE_FILE in the workers"
        )
    return merge_logs(run_dirs)


@click.group()
def timeline() -> None:
    """Merge and inspect the event timelines of a run.

    Workers record events with rallypoint.timer.event / start_event / end_event; the agent
    gives each one a log at <log_dir>/attempt_N/timeline/rank_R.jsonl.
    """


@timeline.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("trace.json"), show_default=True
)
def merge(run_dirs: tuple[Path, ...], output: Path) -> None:
    """Merge the logs under RUN_DIRS into one Chrome trace (open it in Perfetto)."""
    tl = _load(run_dirs)
    tl.write_chrome_trace(output)
    unfinished = sum(1 for s in tl.spans if s.unfinished)
    note = f", {unfinished} unfinished" if unfinished else ""
    click.echo(f"wrote {output}: {len(tl.spans)} events from ranks {', '.join(map(str, tl.ranks))}{note}")


@timeline.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--step-event", default="step", show_default=True, help="The event that delimits steps.")
@click.option(
    "--threshold",
    type=click.FloatRange(min=0),
    default=0.2,
    show_default=True,
    help="A straggler's step is longer than (1 + THRESHOLD) x the median.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def report(run_dirs: tuple[Path, ...], step_event: str, threshold: float, as_json: bool) -> None:
    """Per step: the slowest rank, stragglers and gaps between steps."""
    from rallypoint.timer.merge import format_report, step_report

    tl = _load(run_dirs)
    steps = step_report(tl, step_event=step_event, threshold=threshold)
    if as_json:
        data = [
            {
                "attempt": r.attempt,
                "step": r.step,
                "durations_ns": {str(k): v for k, v in r.durations_ns.items()},
                "slowest_rank": r.slowest_rank,
                "stragglers": list(r.stragglers),
                "gap_ns": {str(k): v for k, v in r.gap_ns.items()},
                "skew_ns": r.skew_ns,
            }
            for r in steps
        ]
        json.dump({"ranks": tl.ranks, "steps": data}, sys.stdout, indent=2)
        click.echo()
        return
    click.echo(format_report(tl, steps, step_event=step_event))
