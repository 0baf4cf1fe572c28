"""A heartbeat record that is not one fails the round at once, naming the node, for every node.

Only rallypoint writes heartbeat records, always well formed. One that does not parse (a file
backend's file that is not JSON) used to fail the node that read it, with exit 1, while its peers
re-rendezvoused and waited the whole join timeout for it; one that parses but is not a heartbeat
record counted as a silent node. Now the reader closes the job as failed, with a reason that
names the node, and every member stops at once.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from rallypoint.rendezvous.errors import RendezvousStateError
from rallypoint.rendezvous.keyspace import Header, JoinRecord, Member
from rallypoint.rendezvous.membership import Unreadable, heartbeat_problem
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.round_io import RoundIO
from rallypoint.rendezvous.state import CasHeader, NeedHeartbeats, RendezvousStateMachine, Settings, View
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

TIMEOUTS = RendezvousTimeouts(join=60, last_call=0.1, close=5, heartbeat_interval=0.25, heartbeat_timeout=1.5)
ROUND0 = Header(round=0, complete=True, participants=(Member("node0", "inc-a"), Member("node1", "inc-b")))
CORRUPT = [
    ("garbage", "it holds 'garbage', not a heartbeat record"),
    ({"inc": 1, "seq": 2}, "not a heartbeat record"),
    ({"inc": "inc-b", "seq": True}, "not a heartbeat record"),
    (Unreadable("rendezvous state file /x/hb/node1 is corrupt (not JSON)"), "/x/hb/node1 is corrupt (not JSON)"),
]


def _member() -> RendezvousStateMachine:
    machine = RendezvousStateMachine(make_node(0), "inc-a", Settings(2, 2, TIMEOUTS, "hb"))
    assert type(machine.step(View(ROUND0, 1), 0.0)).__name__ == "Finished"
    return machine


@pytest.mark.parametrize(("value", "says"), CORRUPT)
def test_a_running_round_is_closed_as_failed_at_once(value: Any, says: str) -> None:
    action = _member().check_peers(View(ROUND0, 1, heartbeats={"node1": value}), 0.3)

    assert isinstance(action, CasHeader)
    assert (action.header.closed, action.header.failed) == (True, True)
    assert action.header.reason.startswith("the heartbeat record of node 'node1' (hb/node1) is corrupt: ")
    assert says in action.header.reason


def test_a_well_formed_or_absent_record_is_judged_by_liveness_only() -> None:
    machine = _member()
    assert machine.check_peers(View(ROUND0, 1, heartbeats={"node1": {"inc": "inc-b", "seq": 3}}), 0.3) is None
    assert machine.check_peers(View(ROUND0, 1, heartbeats={"node1": None}), 0.6) is None
    assert heartbeat_problem({"inc": "x", "seq": 1, "later": "fields"}) is None


def test_a_joining_node_fails_the_round_too() -> None:
    machine = RendezvousStateMachine(make_node(0), "inc-a", Settings(2, 3, TIMEOUTS, "hb"))
    machine.begin(0.0)
    machine.joined(0, 1)
    joins = {f"node{i}": JoinRecord(make_node(i), f"inc{i}", i) for i in range(2)}
    joins["node0"] = JoinRecord(make_node(0), "inc-a", 0)
    view = View(Header(round=0), 1, count=2, joins=joins)
    assert isinstance(machine.step(view, 0.3), NeedHeartbeats)  # the first check is due

    action = machine.step(View(Header(round=0), 1, count=2, joins=joins, heartbeats={"node1": "garbage"}), 0.3)

    assert isinstance(action, CasHeader)
    assert action.header.closed
    assert action.header.failed
    assert "node 'node1'" in action.header.reason


class _CorruptHeartbeats(MemoryBackend):
    """A backend whose heartbeat records cannot be read, as a file backend's corrupt file."""

    def get(self, key: str) -> Any:
        if key.startswith("hb/"):
            raise RendezvousStateError(f"rendezvous state file /run/{key} is corrupt (not JSON)")
        return super().get(key)


def test_reading_an_unreadable_record_names_it_instead_of_failing_the_reader() -> None:
    backend = _CorruptHeartbeats(f"hb-{uuid.uuid4().hex[:8]}", shared=False)
    io = RoundIO(backend, _member())

    assert io.read_heartbeats(("node1",)) == {
        "node1": Unreadable("rendezvous state file /run/hb/node1 is corrupt (not JSON)")
    }
