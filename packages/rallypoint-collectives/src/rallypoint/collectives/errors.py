"""Errors of the collective facade. Importing this module does not import torch."""

from __future__ import annotations

from collections.abc import Sequence

from rallypoint.core.errors import PluginError, RallypointError

__all__ = ["BackendUnavailableError", "CollectiveTimeout", "format_ranks"]


def format_ranks(ranks: Sequence[int]) -> str:
    """Write ranks compactly, runs as ranges.

    >>> format_ranks([0, 1, 2, 5, 7, 8])
    '0-2, 5, 7-8'
    >>> format_ranks([])
    'none'
    """
    if not ranks:
        return "none"
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = ordered[0]
    for r in [*ordered[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


class BackendUnavailableError(PluginError):
    """The collective backend asked for cannot run on this machine (e.g. NCCL without CUDA).

    Attributes:
        backend: the backend name asked for.
        reason: why it cannot run, from the backend's availability check.
        where: where the name came from (argument, environment variable).
    """

    def __init__(self, backend: str, reason: str, *, where: str, alternatives: Sequence[str] = ()) -> None:
        self.backend = backend
        self.reason = reason
        self.where = where
        hint = (
            f"Use one that can run here ({', '.join(alternatives)}) or 'auto'"
            if alternatives
            else "No installed collective backend can run here; install torch with distributed support"
        )
        super().__init__(f"collective backend {backend!r} ({where}) cannot run here: {reason}. {hint}.")


class CollectiveTimeout(RallypointError, TimeoutError):
    """A collective or point-to-point call did not complete within its timeout.

    Attributes:
        op: the operation, e.g. ``"all_reduce"``.
        group: the group's name: ``"WORLD"`` or ``"group <torch group name>"``.
        group_ranks: the global ranks of the group.
        missing: global ranks that did not arrive (empty when every rank arrived but the call
            still did not complete, or when they could not be determined: see ``detail``).
        arrived: global ranks known to have reached the same call.
        rank: the global rank that raised the error.
        timeout: the timeout in seconds.
        detail: how the missing ranks were determined, and anything unusual seen.

    After this error the process group is not usable: the call may still be pending inside
    torch. Destroy it (:func:`rallypoint.collectives.destroy`) and exit, or let the error end the
    process, so that the agent restarts the workers. Neither waits for the pending call: the group
    is marked broken (see :mod:`rallypoint.collectives.broken`).
    """

    def __init__(
        self,
        *,
        op: str,
        group: str,
        group_ranks: Sequence[int],
        missing: Sequence[int],
        arrived: Sequence[int],
        rank: int,
        timeout: float,
        detail: str = "",
    ) -> None:
        self.op = op
        self.group = group
        self.group_ranks = tuple(group_ranks)
        self.missing = tuple(sorted(missing))
        self.arrived = tuple(sorted(arrived))
        self.rank = rank
        self.timeout = timeout
        self.detail = detail
        if self.missing:
            noun = "rank" if len(self.missing) == 1 else "ranks"
            what = f"{noun} {format_ranks(self.missing)} did not arrive"
        else:
            what = "the ranks that did not arrive could not be determined"
        message = (
            f"{op} on {group} (ranks {format_ranks(self.group_ranks)}) timed out after {timeout:g}s "
            f"on rank {rank}: {what}"
        )
        if detail:
            message += f" ({detail})"
        message += (
            ". The process group is no longer usable: destroy it (rallypoint.collectives.destroy()) "
            "and exit so that the agent can restart the workers."
        )
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:  # keyword-only __init__: pickle by attributes
        return (
            _rebuild_timeout,
            (self.op, self.group, self.group_ranks, self.missing, self.arrived, self.rank, self.timeout, self.detail),
        )


def _rebuild_timeout(
    op: str,
    group: str,
    group_ranks: Sequence[int],
    missing: Sequence[int],
    arrived: Sequence[int],
    rank: int,
    timeout: float,
    detail: str,
) -> CollectiveTimeout:
    return CollectiveTimeout(
        op=op,
        group=group,
        group_ranks=group_ranks,
        missing=missing,
        arrived=arrived,
        rank=rank,
        timeout=timeout,
        detail=detail,
    )
