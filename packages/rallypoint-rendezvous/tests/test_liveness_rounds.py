"""Liveness observations do not outlive the round (and incarnation) they were made in.

A node restarted under the same id writes its first heartbeat one ``heartbeat_interval`` after it
starts joining. Until then its heartbeat record still holds the value its killed predecessor
left. A peer that kept its observation of that value from the previous round took the new
incarnation for dead as soon as the next round completed, and opened yet another round (seen in
CI: a restarted agent's job ran three rounds instead of two).
"""

from __future__ import annotations

from rallypoint.rendezvous.keyspace import Header, Member
from rallypoint.rendezvous.state import CasHeader, RendezvousStateMachine, Settings, View
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

TIMEOUTS = RendezvousTimeouts(join=60, last_call=0.1, close=5, heartbeat_interval=0.25, heartbeat_timeout=1.5)


def _member_of(machine: RendezvousStateMachine, header: Header, now: float) -> None:
    action = machine.step(View(header, 1), now)
    assert type(action).__name__ == "Finished", action


def test_a_restarted_peer_is_judged_by_its_new_incarnation_not_the_old_value() -> None:
    a = RendezvousStateMachine(make_node(0), "inc-a", Settings(2, 2, TIMEOUTS, "lv"))
    old_b = {"inc": "inc-b1", "seq": 7}
    round0 = Header(round=0, complete=True, participants=(Member("node0", "inc-a"), Member("node1", "inc-b1")))
    _member_of(a, round0, now=0.0)
    # round 0 runs; node1's heartbeat was last seen changing at t=1, then node1 is killed
    assert a.check_peers(View(round0, 1, heartbeats={"node1": {"inc": "inc-b1", "seq": 6}}), 0.5) is None
    assert a.check_peers(View(round0, 1, heartbeats={"node1": old_b}), 1.0) is None
    # node1's agent is restarted: it opens round 1, node0 joins it, round 1 completes at t=2.0
    a.begin(1.8)
    round1 = Header(round=1, complete=True, participants=(Member("node0", "inc-a"), Member("node1", "inc-b2")))
    _member_of(a, round1, now=2.0)
    # the new node1 has not beaten yet (its first beat is one interval after it began): its
    # record still holds the old value, unchanged for 1.6 s of node0's clock, but node0 has only
    # watched the new incarnation for 0.1 s
    assert a.check_peers(View(round1, 2, heartbeats={"node1": old_b}), 2.1) is None
    # a peer that really is gone is still found dead, heartbeat_timeout after node0 first saw it
    assert a.check_peers(View(round1, 2, heartbeats={"node1": old_b}), 3.0) is None
    dead = a.check_peers(View(round1, 2, heartbeats={"node1": old_b}), 3.7)
    assert isinstance(dead, CasHeader)
    assert dead.header.round == 2
    assert "no heartbeat from 'node1'" in dead.header.reason


def test_a_new_attempt_judges_its_joiners_from_its_own_observations() -> None:
    """An open round's joiners are judged from the attempt's own observations, not older ones."""
    a = RendezvousStateMachine(make_node(0), "inc-a", Settings(2, 3, TIMEOUTS, "lv"))
    round0 = Header(round=0, complete=True, participants=(Member("node0", "inc-a"), Member("node1", "inc-b1")))
    _member_of(a, round0, now=0.0)
    stale = {"inc": "inc-b1", "seq": 3}
    assert a.check_peers(View(round0, 1, heartbeats={"node1": stale}), 0.5) is None
    # a new attempt starts at t=1.9: observations from the running round do not carry into it
    a.begin(1.9)
    assert a.liveness.is_dead("node1", 2.2) is False
