"""The global timeline: gathered through the job's store, or read from logs (:func:`get_timeline`).

:func:`gather_timeline` is a collective: every rank of the job calls it (the same number of
times). Each rank first estimates its clock offset against rank 0
(:func:`~rallypoint.timer.clock.sync_clocks`), then writes its own records, as its log holds
them, under one key of the store (``rallypoint/timeline/gather/<n>/<rank>``) and reads every
other rank's. Every rank gets the same :class:`~rallypoint.timer.merge.Timeline`: every rank of
every node, on rank 0's clock. Nothing is read from the file system, so ranks on other hosts are
included. The last rank to finish reading deletes the keys.

The store is torch.distributed's default store (the one every process group of the job uses)
unless one is given. Importing this module does not import torch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rallypoint.timer.clock import _default_store, _next_generation, sync_clocks
from rallypoint.timer.merge import Timeline, load_records, merge_logs

if TYPE_CHECKING:
    from rallypoint.timer.recorder import Recorder

__all__ = ["PREFIX", "gather_timeline", "get_timeline", "process_group_ready"]

PREFIX = "rallypoint/timeline/gather"


def process_group_ready() -> bool:
    """Whether torch.distributed's default process group is up (without importing torch)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported torch: no group
        return False


def gather_timeline(
    store: Any = None,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    recorder: Recorder | None = None,
    sync: bool = True,
    timeout: float = 600.0,
    prefix: str = PREFIX,
) -> Timeline:
    """Every rank's events of this attempt, on rank 0's clock (a collective: every rank calls it).

    Args:
        store: a torch ``Store`` (``set``, blocking ``get``, ``add``, ``delete_key``); default
            torch.distributed's default store, with rank and world size from the process group.
        rank: this worker's rank (default: from the process group).
        world_size: the number of ranks (default: from the process group).
        recorder: whose records to share; default the process-wide recorder.
        sync: estimate the clock offsets first (:func:`~rallypoint.timer.clock.sync_clocks`);
            without it, a rank's latest earlier estimate is used, if any.
        timeout: seconds to wait for every rank to call it (a store with ``check`` only).
        prefix: store key prefix.

    Returns:
        The merged timeline, the same on every rank.

    Raises:
        TimelineError: some ranks did not call it within ``timeout`` (they are named).
    """
    if recorder is None:
        from rallypoint.timer.timeline import get_recorder

        recorder = get_recorder()
    if store is None:
        store, default_rank, default_world = _default_store()
        rank = default_rank if rank is None else rank
        world_size = default_world if world_size is None else world_size
    if rank is None or world_size is None:
        raise ValueError("gather_timeline(store=...) needs rank= and world_size= too")
    base = f"{prefix}/{_next_generation(prefix, rank)}"
    _all_arrive(store, base, rank, world_size, timeout)
    if sync:
        sync_clocks(store, rank=rank, world_size=world_size, recorder=recorder)
    mine = b"\n".join(json.dumps(r, separators=(",", ":")).encode() for r in _this_process(recorder.records()))
    store.set(f"{base}/{rank}", mine)
    logs = []
    for r in range(world_size):
        raw = mine if r == rank else store.get(f"{base}/{r}")
        records = [json.loads(line) for line in bytes(raw).splitlines() if line.strip()]
        logs.append(load_records(records, rank=r))
    if int(store.add(f"{base}/done", 1)) == world_size:  # everyone has read: tidy up
        delete = getattr(store, "delete_key", None)
        if delete is not None:
            keys = [f"{base}/{kind}{r}" for r in range(world_size) for kind in ("", "arrived/")]
            for key in [*keys, f"{base}/done"]:
                delete(key)
    return Timeline(logs)


def _this_process(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records written by this process (a log file given by the user may hold earlier runs)."""
    pid = os.getpid()
    starts = [i for i, r in enumerate(records) if r.get("t") == "meta" and r.get("pid") == pid]
    return records[starts[0] :] if starts else records


def _all_arrive(store: Any, base: str, rank: int, world_size: int, timeout: float) -> None:
    """Wait until every rank has called :func:`gather_timeline` (this call ``base``), or fail naming them.

    Without this, a rank calling it alone (only rank 0, say) would block in the clock
    exchange for as long as the store lets it. A store without ``check`` is not watched.
    """
    store.set(f"{base}/arrived/{rank}", b"1")
    check = getattr(store, "check", None)
    if check is None:
        return
    end = time.monotonic() + timeout
    pending = [r for r in range(world_size) if r != rank]
    while pending:
        pending = [r for r in pending if not check([f"{base}/arrived/{r}"])]
        if not pending:
            return
        if time.monotonic() >= end:
            from rallypoint.timer.timeline_config import TimelineError

            missing = ", ".join(map(str, pending))
            raise TimelineError(
                f"get_timeline() on rank {rank}: rank(s) {missing} did not call it within {timeout:g}s. It is a "
                "collective once the process group is up: call it on every rank (or read the logs with "
                "get_timeline(run_dir))"
            )
        time.sleep(0.01)


def get_timeline(run_dir: str | Path | None = None) -> Timeline:
    """The merged global timeline.

    Args:
        run_dir: a run directory (or log file) to read. Default: in a worker whose process
            group is up, every rank of every node of this attempt, on rank 0's clock, gathered
            through the job's store (a collective: every rank calls it; see
            :func:`gather_timeline`); without a process group, this process's own log
            directory (or its in-memory events).
    """
    if run_dir is not None:
        return merge_logs([run_dir])
    if process_group_ready():
        return gather_timeline()
    from rallypoint.timer.timeline import get_recorder

    recorder = get_recorder()
    recorder.flush()
    if recorder.path is not None:
        return merge_logs([recorder.path.parent])
    return Timeline([load_records(recorder.records(), rank=recorder.rank)])
