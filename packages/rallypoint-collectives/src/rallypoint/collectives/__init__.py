"""rallypoint collectives: worker-side process-group initialisation and a collective facade.

``rallypoint.collectives.init()`` reads the worker environment, picks the backend named in
config through the ``rallypoint_collective_backends`` hook and initialises torch's process group.
The facade (``send``, ``recv``, ``isend``, ``irecv``, ``broadcast``, ``all_reduce``, ``reduce``,
``all_gather``, ``gather``, ``scatter``, ``barrier``, ``new_group``, ``get_rank``,
``get_world_size``, ``ReduceOp``) is gathered in :mod:`rallypoint.collectives.facade` from the
modules that do each job: :mod:`~rallypoint.collectives.process_group` (``init``),
:mod:`~rallypoint.collectives.ops` (the operations) and :mod:`~rallypoint.collectives.waiting`
(the timeout engine). Every call accepts ``timeout=`` (seconds or a shared :class:`Deadline`)
and raises :class:`CollectiveTimeout` naming the ranks that did not arrive, unless a timeout
handler (:func:`set_timeout_handler`, or ``on_timeout=`` on the call; see
:mod:`~rallypoint.collectives.timeouts`) decides otherwise.

Importing this package does not import torch: the facade's names are loaded on first access.
Hook specifications live in :mod:`rallypoint.collectives.hookspecs`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rallypoint.collectives.errors import BackendUnavailableError, CollectiveTimeout
from rallypoint.collectives.records import Availability, CollectiveBackendRecord
from rallypoint.collectives.timeouts import (
    Deadline,
    DeadlineWait,
    ExitProcess,
    RaiseTimeout,
    TimeoutDecision,
    TimeoutEvent,
    TimeoutHandler,
    WaitMore,
    get_timeout_handler,
    set_timeout_handler,
)

if TYPE_CHECKING:
    from rallypoint.collectives.facade import (
        CollectivesInfo,
        ProcessGroup,
        ReduceOp,
        Work,
        all_gather,
        all_reduce,
        barrier,
        broadcast,
        default_timeout,
        destroy,
        gather,
        get_rank,
        get_world_size,
        init,
        irecv,
        is_initialized,
        isend,
        new_group,
        recv,
        reduce,
        scatter,
        send,
    )

__all__ = [
    "init",
    "destroy",
    "is_initialized",
    "default_timeout",
    "CollectivesInfo",
    "send",
    "recv",
    "isend",
    "irecv",
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "barrier",
    "new_group",
    "get_rank",
    "get_world_size",
    "ReduceOp",
    "ProcessGroup",
    "Work",
    "CollectiveTimeout",
    "BackendUnavailableError",
    "Availability",
    "CollectiveBackendRecord",
    "Deadline",
    "DeadlineWait",
    "ExitProcess",
    "RaiseTimeout",
    "TimeoutDecision",
    "TimeoutEvent",
    "TimeoutHandler",
    "WaitMore",
    "get_timeout_handler",
    "set_timeout_handler",
]

_LIGHT = {
    "CollectiveTimeout",
    "BackendUnavailableError",
    "Availability",
    "CollectiveBackendRecord",
    "Deadline",
    "DeadlineWait",
    "ExitProcess",
    "RaiseTimeout",
    "TimeoutDecision",
    "TimeoutEvent",
    "TimeoutHandler",
    "WaitMore",
    "get_timeout_handler",
    "set_timeout_handler",
}
_FACADE = frozenset(__all__) - _LIGHT


def __getattr__(name: str) -> Any:
    """Load the facade (and torch) on first access to one of its names."""
    if name in _FACADE:
        value = getattr(importlib.import_module("rallypoint.collectives.facade"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
