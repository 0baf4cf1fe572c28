"""``rallypoint_rendezvous_timed_out`` answers: wait more (bounded), give up, or no opinion.

Real handlers on the in-process memory backend; what is asserted is what a job sees: whether the
node stays in the round and the round completes when the missing node comes, how soon the
timeout error comes, and how often the hook is asked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from rallypoint.core.plugins import get_plugin_manager, hookimpl
from rallypoint.rendezvous import GiveUp, RendezvousTimeoutError, WaitMore
from rallypoint.rendezvous.errors import MAX_WAIT_MORE, MAX_WAIT_MORE_TIMES, TimeoutInfo, extra_wait
from rallypoint.rendezvous.handler import RendezvousHandler
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

TIMEOUTS = RendezvousTimeouts(join=0.4, last_call=0.1, close=5, heartbeat_interval=0.1, heartbeat_timeout=2.0)


class Answering:
    """A plugin whose hook records each call and answers with ``answer(info)``."""

    def __init__(self, answer: Callable[[TimeoutInfo], Any]) -> None:
        self.answer = answer
        self.seen: list[TimeoutInfo] = []
        self.asked = threading.Event()

    @hookimpl
    def rallypoint_rendezvous_timed_out(self, info: TimeoutInfo) -> Any:
        self.seen.append(info)
        self.asked.set()
        return self.answer(info)


def _handler(ns: str, i: int, pm: Any = None) -> RendezvousHandler:
    backend = MemoryBackend("run", namespace=ns)
    return RendezvousHandler(backend, make_node(i), min_nodes=2, max_nodes=2, timeouts=TIMEOUTS, pm=pm)


def test_wait_more_keeps_the_node_in_the_round_until_the_late_node_comes(request: pytest.FixtureRequest) -> None:
    plugin = Answering(lambda info: WaitMore(30))
    first = _handler(request.node.nodeid, 0, get_plugin_manager(plugins=[plugin], autoload=False))
    late = _handler(request.node.nodeid, 1)
    results: dict[str, Any] = {}

    def join_late() -> None:
        plugin.asked.wait(30)
        results["late"] = late.next_rendezvous()

    thread = threading.Thread(target=join_late)
    thread.start()
    try:
        results["first"] = first.next_rendezvous()  # would raise after 0.4 s without the answer
    finally:
        thread.join(30)
        first.shutdown()
        late.shutdown()
    assert len(plugin.seen) == 1
    assert plugin.seen[0].timeout == "join"
    assert plugin.seen[0].present == ("node0",)
    ids = [p.node_id for p in results["first"].participants]
    assert ids == [p.node_id for p in results["late"].participants]
    assert sorted(ids) == ["node0", "node1"]


def test_give_up_from_any_plugin_wins(request: pytest.FixtureRequest) -> None:
    waiter, quitter = Answering(lambda info: WaitMore(30)), Answering(lambda info: GiveUp("no spare nodes"))
    h = _handler(request.node.nodeid, 0, get_plugin_manager(plugins=[waiter, quitter], autoload=False))
    start = time.monotonic()
    try:
        with pytest.raises(RendezvousTimeoutError, match="join timeout"):
            h.next_rendezvous()
    finally:
        h.shutdown()
    assert time.monotonic() - start < 10
    assert len(waiter.seen) == len(quitter.seen) == 1


def test_a_hook_returning_none_keeps_the_old_behaviour(request: pytest.FixtureRequest) -> None:
    plugin = Answering(lambda info: None)
    h = _handler(request.node.nodeid, 0, get_plugin_manager(plugins=[plugin], autoload=False))
    try:
        with pytest.raises(RendezvousTimeoutError) as err:
            h.next_rendezvous()
    finally:
        h.shutdown()
    assert plugin.seen == [err.value.info]


def test_extensions_are_bounded(request: pytest.FixtureRequest) -> None:
    plugin = Answering(lambda info: WaitMore(0.05))
    h = _handler(request.node.nodeid, 0, get_plugin_manager(plugins=[plugin], autoload=False))
    start = time.monotonic()
    try:
        with pytest.raises(RendezvousTimeoutError):
            h.next_rendezvous()
    finally:
        h.shutdown()
    assert len(plugin.seen) == MAX_WAIT_MORE_TIMES + 1  # asked after each extension, then it gives up
    assert time.monotonic() - start >= 0.4 + MAX_WAIT_MORE_TIMES * 0.05


def test_answers_are_combined_and_cut() -> None:
    info = TimeoutInfo("run", 0, "join", 1.0, "node0")
    assert extra_wait([None, WaitMore(2), WaitMore(5)], info, 0) == 5
    assert extra_wait([WaitMore(1e9)], info, 0) == MAX_WAIT_MORE
    assert extra_wait([WaitMore(2), GiveUp()], info, 0) is None
    assert extra_wait([None], info, 0) is None
    assert extra_wait([], info, 0) is None
    assert extra_wait(["soon", WaitMore(1)], info, 0) == 1  # a foreign answer is ignored, with a warning
    assert extra_wait([WaitMore(1)], info, MAX_WAIT_MORE_TIMES) is None
    for bad in (0, -1, float("inf")):
        with pytest.raises(ValueError, match="WaitMore"):
            WaitMore(bad)
