"""A TimelineClient in a training loop: nested events, callbacks, and the global timeline.

Each rank records ``step`` > ``forward`` / ``backward`` > ``all_reduce`` events through one
``rallypoint.timer.TimelineClient``; its callbacks count the events and report the slowest step
as it ends. At the end every rank calls ``client.get_timeline()`` (a collective): each gets every
rank of every node of this attempt, on rank 0's clock, gathered through the job's store. Rank 0
prints a summary (one JSON line) and writes a Chrome trace.

    --steps N       training steps (default 3)
    --config PATH   the timeline config (default: [timer] timeline_config from the job file)
    --log PATH      the event log (default: the agent's, under log_dir); {rank} is replaced,
                    and several ranks sharing one name get .rank<R> added before the suffix
    --trace PATH    where rank 0 writes the Chrome trace (open it in https://ui.perfetto.dev)
    --summary DIR   every rank writes what it got as DIR/rank<R>.json
"""

from __future__ import annotations

import argparse
import json
import socket
from collections import Counter
from pathlib import Path

import torch

import rallypoint.collectives as rc
from rallypoint.timer import Event, TimelineClient


def main() -> None:
    """Train a few steps under the timeline, then gather and summarise it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--config")
    parser.add_argument("--log")
    parser.add_argument("--trace")
    parser.add_argument("--summary")
    args = parser.parse_args()

    rc.init()
    rank = rc.get_rank()
    counts: Counter[str] = Counter()
    slowest = {"step": -1, "seconds": 0.0}

    def started(event: Event) -> None:
        counts["started"] += 1

    def ended(event: Event) -> None:
        counts["ended"] += 1
        if event.name == "step" and (event.duration_s or 0.0) > slowest["seconds"]:
            slowest.update(step=event.args["step"], seconds=event.duration_s or 0.0)

    client = TimelineClient(config_path=args.config, log_path=args.log, on_event_start=started, on_event_end=ended)
    w = torch.zeros(4)
    for step in range(args.steps):
        client.start_event("step", step=step)
        with client.event("forward", step=step):
            loss = ((w - float(rank + 1)) ** 2).sum()
        with client.event("backward"):
            grad = 2 * (w - float(rank + 1))
            with client.event("all_reduce", numel=grad.numel()):
                rc.all_reduce(grad)
            w -= 0.1 * grad / rc.get_world_size()
        with client.event("debug_probe"):  # excluded by the config: not recorded, no callbacks
            pass
        client.end_event("step")
    print(f"rank {rank}: {counts['started']} events started, {counts['ended']} ended; slowest {slowest}", flush=True)

    timeline = client.get_timeline()  # every rank calls it
    summary = {
        "rank": rank,
        "host": socket.gethostname(),
        "log": str(client.log_path),
        "loss": float(loss),
        "callbacks": dict(counts),
        "ranks": timeline.ranks,
        "hosts": sorted({log.host for log in timeline.logs}),
        "spans": sorted(Counter(f"{s.rank}:{s.name}" for s in timeline.spans).items()),
        "offsets_known": all(log.uncertainty_ns is not None for log in timeline.logs),
    }
    if args.summary:
        Path(args.summary).mkdir(parents=True, exist_ok=True)
        (Path(args.summary) / f"rank{rank}.json").write_text(json.dumps(summary))
    if rank == 0:
        print("TIMELINE " + json.dumps(summary), flush=True)
        if args.trace:
            print(f"rank 0: Chrome trace written to {timeline.write_chrome_trace(args.trace)}", flush=True)
    client.close()
    rc.destroy()


if __name__ == "__main__":
    main()
