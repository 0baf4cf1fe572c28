"""The facade's operations: torch.distributed's calls, with timeouts that name ranks.

Every function takes and returns plain torch tensors and process groups, with torch's argument
names and order; each one also accepts ``timeout=`` (seconds, or a
:class:`~rallypoint.collectives.timeouts.Deadline` shared by several calls; ``None`` means the job
default, ``[collectives] timeout``) and ``on_timeout=`` (a timeout handler for this call, see
:mod:`rallypoint.collectives.timeouts`). Synchronous calls return the tensor(s) they filled (``recv`` returns
the sender's rank, as torch's does); ``async_op=True`` returns a
:class:`~rallypoint.collectives.waiting.Work` whose ``wait(timeout=None)`` applies the same
timeout rules. The collectives share one fast path,
:func:`~rallypoint.collectives.waiting.finish_collective`.

Importing this module imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as _dist

from rallypoint.collectives.state import GROUPS, PG_TIMEOUT_MARGIN, STATE, group_info, is_stream_ordered
from rallypoint.collectives.timeouts import Deadline, TimeoutHandler
from rallypoint.collectives.waiting import Work, complete, finish_collective

__all__ = [
    "ProcessGroup",
    "ReduceOp",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "gather",
    "get_rank",
    "get_world_size",
    "irecv",
    "isend",
    "new_group",
    "recv",
    "reduce",
    "scatter",
    "send",
]

#: torch's reduction operations: ``SUM``, ``PRODUCT``, ``MAX``, ``MIN``, ``AVG`` (Gloo in torch
#: >= 2.13 and NCCL have it), ``BAND``, ``BOR``, ``BXOR``. The very same class as
#: ``torch.distributed.ReduceOp``, so either can be passed.
ReduceOp = _dist.ReduceOp
#: torch's process group type, as returned by :func:`new_group`.
ProcessGroup = _dist.ProcessGroup

_SUM = _dist.ReduceOp.SUM


# ------------------------------------------------------------------------------------------------
# Point to point: the peer is the rank that may not arrive, so these wait with the peer's name.


def send(
    tensor: torch.Tensor,
    dst: int,
    group: ProcessGroup | None = None,
    tag: int = 0,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> None:
    """Send ``tensor`` to global rank ``dst`` and wait until it is sent (as torch's ``send``)."""
    info = GROUPS.get(group) or group_info(group)
    work = _dist.isend(tensor, dst, group, tag)
    if work is not None:
        complete(work, "send", info, 0, timeout, dst, on_timeout)


def recv(
    tensor: torch.Tensor,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> int:
    """Receive into ``tensor`` from global rank ``src`` (any rank if ``None``); returns the sender."""
    info = GROUPS.get(group) or group_info(group)
    work = _dist.irecv(tensor, src, group, tag)
    if work is None:
        return -1
    complete(work, "recv", info, 0, timeout, -1 if src is None else src, on_timeout)
    if src is not None:
        return src
    group_src = int(work._source_rank())
    return _dist.get_global_rank(info.pg, group_src) if group is not None else group_src


def isend(
    tensor: torch.Tensor,
    dst: int,
    group: ProcessGroup | None = None,
    tag: int = 0,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> Work | None:
    """Start sending ``tensor`` to ``dst``; ``wait()`` on the result (``None`` off-group)."""
    info = GROUPS.get(group) or group_info(group)
    work = _dist.isend(tensor, dst, group, tag)
    return None if work is None else Work(work, "isend", info, 0, timeout, dst, None, on_timeout)


def irecv(
    tensor: torch.Tensor,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> Work | None:
    """Start receiving into ``tensor``; ``wait()`` on the result, then ``source_rank()``."""
    info = GROUPS.get(group) or group_info(group)
    work = _dist.irecv(tensor, src, group, tag)
    return (
        None if work is None else Work(work, "irecv", info, 0, timeout, -1 if src is None else src, tensor, on_timeout)
    )


# ------------------------------------------------------------------------------------------------
# Collectives: each one issues torch's call (asynchronously unless the group is stream-ordered and
# the call synchronous without a timeout) and ends in the shared fast path, finish_collective.


def broadcast(
    tensor: torch.Tensor,
    src: int,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> Any:
    """Copy ``tensor`` from global rank ``src`` to every rank of the group; returns ``tensor``."""
    info = GROUPS.get(group) or group_info(group)
    work = _dist.broadcast(tensor, src, group, info.blocking or async_op or timeout is not None)
    return finish_collective(work, "broadcast", info, async_op, timeout, tensor, on_timeout)


def all_reduce(
    tensor: torch.Tensor,
    op: Any = _SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> Any:
    """Reduce ``tensor`` across the group in place with ``op``; every rank gets the result."""
    info = GROUPS.get(group) or group_info(group)
    work = _dist.all_reduce(tensor, op, group, info.blocking or async_op or timeout is not None)
    return finish_collective(work, "all_reduce", info, async_op, timeout, tensor, on_timeout)


def reduce(
    tensor: torch.Tensor,
    dst: int,
    op: Any = _SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> Any:
    """Reduce ``tensor`` onto global rank ``dst`` with ``op``; returns ``tensor``.

    Only ``dst``'s tensor is guaranteed to hold the result; the others' content is unspecified
    (as in torch).
    """
    info = GROUPS.get(group) or group_info(group)
    work = _dist.reduce(tensor, dst, op, group, info.blocking or async_op or timeout is not None)
    return finish_collective(work, "reduce", info, async_op, timeout, tensor, on_timeout)


def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> Any:
    """Gather every rank's ``tensor`` into ``tensor_list`` on every rank; returns ``tensor_list``."""
    info = GROUPS.get(group) or group_info(group)
    work = _dist.all_gather(tensor_list, tensor, group, info.blocking or async_op or timeout is not None)
    return finish_collective(work, "all_gather", info, async_op, timeout, tensor_list, on_timeout)


def gather(
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int = 0,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> Any:
    """Gather every rank's ``tensor`` into ``gather_list`` on global rank ``dst``.

    Returns ``gather_list`` (``None`` on the other ranks, which pass none).
    """
    info = GROUPS.get(group) or group_info(group)
    work = _dist.gather(tensor, gather_list, dst, group, info.blocking or async_op or timeout is not None)
    return finish_collective(work, "gather", info, async_op, timeout, gather_list, on_timeout)


def scatter(
    tensor: torch.Tensor,
    scatter_list: list[torch.Tensor] | None = None,
    src: int = 0,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> Any:
    """Send ``scatter_list[i]`` from global rank ``src`` to the group's rank ``i``, into ``tensor``.

    Returns ``tensor``. Only ``src`` passes ``scatter_list``.
    """
    info = GROUPS.get(group) or group_info(group)
    work = _dist.scatter(tensor, scatter_list, src, group, info.blocking or async_op or timeout is not None)
    return finish_collective(work, "scatter", info, async_op, timeout, tensor, on_timeout)


def barrier(
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | Deadline | None = None,
    on_timeout: TimeoutHandler | None = None,
) -> Any:
    """Wait until every rank of the group reaches this call; ``None`` (or a :class:`Work`)."""
    info = GROUPS.get(group) or group_info(group)
    work = _dist.barrier(group, info.blocking or async_op or timeout is not None)
    return finish_collective(work, "barrier", info, async_op, timeout, None, on_timeout)


# ------------------------------------------------------------------------------------------------
# Groups and ranks


def get_rank(group: ProcessGroup | None = None) -> int:
    """The rank of this worker in ``group`` (global rank by default), as torch's ``get_rank``."""
    return _dist.get_rank(group)


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group`` (the whole job by default)."""
    return _dist.get_world_size(group)


def new_group(
    ranks: Sequence[int] | None = None,
    timeout: float | Deadline | None = None,
    backend: str | None = None,
    **kwargs: Any,
) -> ProcessGroup:
    """Create a sub-group, as torch's ``new_group`` (every rank must call it, members or not).

    Args:
        ranks: global ranks of the members (default: everyone).
        timeout: the group's own default in seconds (a :class:`Deadline`: what is left of it);
            calls on it without ``timeout=`` still use the job default. ``None``: the job default.
        backend: torch backend name (default: the default group's).
        kwargs: passed on to ``torch.distributed.new_group``.
    """
    seconds = STATE.default if timeout is None else timeout.remaining() if isinstance(timeout, Deadline) else timeout
    # A blocking backend's own timeout gets a margin so that the facade's (naming ranks) fires first.
    margin = 0.0 if is_stream_ordered(str(backend or _dist.get_backend())) else PG_TIMEOUT_MARGIN
    group: ProcessGroup = _dist.new_group(
        list(ranks) if ranks is not None else None,
        timeout=timedelta(seconds=seconds + margin),
        backend=backend,
        **kwargs,
    )
    return group
