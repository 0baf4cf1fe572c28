"""Clock-offset estimation of each worker against rank 0, by NTP-style round trips through a store.

Every rank calls :func:`sync_clocks` (a collective: all ranks, the same number of times). Rank 0
answers each other rank's pings in turn; per round trip the client notes its send time ``t0``,
rank 0 its receive and reply times ``t1``, ``t2``, and the client its receive time ``t3``:

* offset (add to the local clock to get rank 0's) = ``((t1 - t0) + (t2 - t3)) / 2``
* delay = ``(t3 - t0) - (t2 - t1)``; the true offset lies within ``offset ± delay / 2``.

The round trip with the smallest delay wins; its half-delay is recorded as the uncertainty.
The store is any object with ``set(key, value)`` and a blocking ``get(key) -> bytes`` (a torch
``Store``: torch.distributed's default store when the process group is initialised).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rallypoint.timer.recorder import Recorder

__all__ = ["ClockEstimate", "ClockStore", "estimate_offset", "sync_clocks"]

PREFIX = "rallypoint/timeline/clock"


class ClockStore(Protocol):
    """The part of a torch ``Store`` that :func:`sync_clocks` uses."""

    def set(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``."""

    def get(self, key: str) -> bytes:
        """Wait for ``key`` and return its value."""


@dataclass(frozen=True)
class ClockEstimate:
    """A worker's clock against the reference rank's.

    Attributes:
        rank: whose clock.
        reference_rank: against whom (0).
        offset_ns: add to a local timestamp to get the reference's time.
        uncertainty_ns: the true offset is within ``offset_ns ± uncertainty_ns``.
        rtt_ns: the best round trip (minus rank 0's turnaround).
        samples: round trips made.
    """

    rank: int
    offset_ns: int
    uncertainty_ns: int
    rtt_ns: int
    samples: int
    reference_rank: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Plain data (what the timeline log's ``clock`` line holds)."""
        return {
            "rank": self.rank,
            "ref": self.reference_rank,
            "offset_ns": self.offset_ns,
            "uncertainty_ns": self.uncertainty_ns,
            "rtt_ns": self.rtt_ns,
            "samples": self.samples,
        }


def estimate_offset(samples: list[tuple[int, int, int, int]]) -> tuple[int, int, int]:
    """``(offset_ns, uncertainty_ns, delay_ns)`` from ``(t0, t1, t2, t3)`` round trips (min delay wins)."""
    if not samples:
        raise ValueError("no round trips")
    best = min(samples, key=lambda s: (s[3] - s[0]) - (s[2] - s[1]))
    t0, t1, t2, t3 = best
    delay = max(0, (t3 - t0) - (t2 - t1))
    offset = ((t1 - t0) + (t2 - t3)) // 2
    return offset, (delay + 1) // 2, delay


_generations: dict[tuple[str, int], int] = {}
_gen_lock = threading.Lock()


def _next_generation(prefix: str, rank: int) -> int:
    with _gen_lock:
        gen = _generations.get((prefix, rank), 0)
        _generations[(prefix, rank)] = gen + 1
        return gen


def _default_store() -> tuple[Any, int, int]:
    try:
        import torch.distributed as dist
    except ImportError as exc:  # pragma: no cover - torch is there in workers
        raise RuntimeError("sync_clocks() without a store needs torch.distributed") from exc
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "sync_clocks() needs a store: initialise the process group first "
            "(rallypoint.collectives.init() or torch.distributed.init_process_group), or pass store="
        )
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    return store, dist.get_rank(), dist.get_world_size()


def sync_clocks(
    store: ClockStore | None = None,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    rounds: int = 8,
    clock: Callable[[], int] | None = None,
    recorder: Recorder | None = None,
    prefix: str = PREFIX,
) -> ClockEstimate:
    """Estimate this worker's clock offset against rank 0 and log it in the timeline.

    A collective: every rank calls it. Rank 0 answers ``rounds`` pings of each other rank.

    Args:
        store: where the round trips go; default torch.distributed's default store (the
            process group must be initialised), with rank and world size from it.
        rank: this worker's rank; default from the process group, else ``RANK``.
        world_size: default from the process group, else ``WORLD_SIZE``.
        rounds: round trips per rank (the fastest one is used).
        clock: nanosecond clock; the timeline's own clock by default (tests inject skewed ones).
        recorder: where to log the estimate; default the process-wide recorder.
        prefix: store key prefix.

    Returns:
        The estimate (rank 0's is zero with zero uncertainty).
    """
    import os

    if recorder is None:
        from rallypoint.timer.timeline import get_recorder

        recorder = get_recorder()
    clock = clock or recorder.clock
    if store is None:
        store, default_rank, default_world = _default_store()
        rank = default_rank if rank is None else rank
        world_size = default_world if world_size is None else world_size
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    if rounds < 1:
        raise ValueError(f"sync_clocks(rounds={rounds}): need at least one round trip")
    base = f"{prefix}/{_next_generation(prefix, rank)}"
    delete = getattr(store, "delete_key", None)

    if rank == 0:
        for peer in range(1, world_size):
            for k in range(rounds):
                store.get(f"{base}/{peer}/{k}/ping")
                t1 = clock()
                t2 = clock()
                store.set(f"{base}/{peer}/{k}/pong", f"{t1},{t2}")
        estimate = ClockEstimate(rank=0, offset_ns=0, uncertainty_ns=0, rtt_ns=0, samples=0)
    else:
        samples = []
        for k in range(rounds):
            t0 = clock()
            store.set(f"{base}/{rank}/{k}/ping", str(t0))
            raw = store.get(f"{base}/{rank}/{k}/pong")
            t3 = clock()
            t1, t2 = (int(x) for x in (raw.decode() if isinstance(raw, bytes) else str(raw)).split(","))
            samples.append((t0, t1, t2, t3))
            if delete is not None:
                with contextlib.suppress(Exception):
                    delete(f"{base}/{rank}/{k}/ping")
                    delete(f"{base}/{rank}/{k}/pong")
        offset, uncertainty, delay = estimate_offset(samples)
        estimate = ClockEstimate(rank=rank, offset_ns=offset, uncertainty_ns=uncertainty, rtt_ns=delay, samples=rounds)
    recorder.record_clock(estimate)
    return estimate
