"""rallypoint rendezvous: how agents on many hosts agree on who is in the job and in which order.

* :mod:`rallypoint.rendezvous.state`: the algorithm, a pure state machine (its records and keys in
  :mod:`~rallypoint.rendezvous.keyspace`, inputs and actions in :mod:`~rallypoint.rendezvous.actions`,
  liveness and the wait list in :mod:`~rallypoint.rendezvous.membership`).
* :mod:`rallypoint.rendezvous.backend`: the key-value protocol a backend implements.
* :mod:`rallypoint.rendezvous.handler`: :class:`RendezvousHandler`, what an agent calls.
* :mod:`rallypoint.rendezvous.memory`: the in-process ``memory`` backend.
* :mod:`rallypoint.rendezvous.testing`: the conformance kit for backends.

Hook specifications live in :mod:`rallypoint.rendezvous.hookspecs`; backends register
:class:`~rallypoint.rendezvous.records.RendezvousBackendRecord` records.
"""

from rallypoint.rendezvous.errors import (
    GiveUp,
    RendezvousBackendError,
    RendezvousClosedError,
    RendezvousError,
    RendezvousStateError,
    RendezvousTimeoutError,
    TimeoutInfo,
    WaitMore,
)
from rallypoint.rendezvous.records import RendezvousBackendRecord
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = [
    "GiveUp",
    "RendezvousBackendError",
    "RendezvousBackendRecord",
    "RendezvousClosedError",
    "RendezvousError",
    "RendezvousStateError",
    "RendezvousTimeoutError",
    "RendezvousTimeouts",
    "TimeoutInfo",
    "WaitMore",
    # the record rallypoint_rendezvous_completed receives (see rallypoint.rendezvous.hookspecs)
    "RendezvousResult",
]


def __getattr__(name: str) -> object:
    # imported on first use: ``import rallypoint.rendezvous`` stays light
    if name == "RendezvousResult":
        from rallypoint.rendezvous.round_io import RendezvousResult

        globals()[name] = RendezvousResult
        return RendezvousResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
