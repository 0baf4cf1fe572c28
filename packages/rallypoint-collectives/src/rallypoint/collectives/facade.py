"""The collective facade: torch.distributed in the seeds' vocabulary, with timeouts that name ranks.

This module gathers the facade's public names, which ``rallypoint.collectives`` loads on first
access. They live where their job is:

* :mod:`rallypoint.collectives.process_group`: :func:`init` (backend choice, options, adopting an
  existing group), :func:`destroy`, :func:`is_initialized`, :class:`CollectivesInfo`;
* :mod:`rallypoint.collectives.ops`: the operations (``send`` ... ``barrier``, ``new_group``,
  ``get_rank``, ``get_world_size``), ``ReduceOp`` and ``ProcessGroup``;
* :mod:`rallypoint.collectives.waiting`: the waiting and timeout engine, :class:`Work` and the
  shared fast path;
* :mod:`rallypoint.collectives.state`: the job default timeout (:func:`default_timeout`,
  :data:`PROBE`) and what is known of each process group.

Importing this module imports torch.
"""

from __future__ import annotations

from rallypoint.collectives.ops import (
    ProcessGroup,
    ReduceOp,
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    gather,
    get_rank,
    get_world_size,
    irecv,
    isend,
    new_group,
    recv,
    reduce,
    scatter,
    send,
)
from rallypoint.collectives.process_group import CollectivesInfo, destroy, init, is_initialized
from rallypoint.collectives.state import PROBE, default_timeout
from rallypoint.collectives.waiting import Work

__all__ = [
    "PROBE",
    "CollectivesInfo",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "default_timeout",
    "destroy",
    "gather",
    "get_rank",
    "get_world_size",
    "init",
    "irecv",
    "is_initialized",
    "isend",
    "new_group",
    "recv",
    "reduce",
    "scatter",
    "send",
]
