"""What the conformance kit's checks share: the backend factory's type, test nodes, short timeouts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rallypoint.rendezvous.backend import RendezvousBackend
from rallypoint.rendezvous.state import NodeInfo
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = ["FAST_TIMEOUTS", "PATIENT_TIMEOUTS", "Factory", "make_node"]

Factory = Callable[[str], RendezvousBackend]

#: Short timeouts for handler tests.
FAST_TIMEOUTS = RendezvousTimeouts(join=20.0, last_call=0.2, close=5.0, heartbeat_interval=0.1, heartbeat_timeout=0.6)


def make_node(i: int, **kw: Any) -> NodeInfo:
    """A test node record ``node<i>``."""
    return NodeInfo(node_id=f"node{i}", host=f"host{i}", addr="127.0.0.1", master_port=30000 + i, **kw)


#: For checks where three nodes must land in one round however late a child process starts:
#: the round completes at once when the third joins (max_nodes), so the longer last call only
#: costs time when fewer join.
PATIENT_TIMEOUTS = dataclasses.replace(FAST_TIMEOUTS, last_call=2.0)
