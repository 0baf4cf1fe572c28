"""A fixed allocation that lost a host: which members are silent, and the failures every survivor reports."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rallypoint.agent.lost_hosts import fatal_losses, silent_members
from rallypoint.agent.ranks import DefaultStrategy, RankNode
from rallypoint.rendezvous.errors import RendezvousBackendError

NODES = [RankNode(node_id=n, group_rank=i, host=n, local_world_size=2) for i, n in enumerate(["a", "b", "c"])]
ASSIGNMENT = DefaultStrategy().assign(NODES)
RESULT = SimpleNamespace(participants=[SimpleNamespace(node_id=n.node_id, host=n.host) for n in NODES])


class Io:
    """Heartbeat records: ``a`` and ``b`` count up on every read, ``c`` stopped."""

    def __init__(self, fail: bool = False) -> None:
        self.reads = 0
        self.fail = fail

    def read_heartbeats(self, ids: tuple[str, ...]) -> dict[str, Any]:
        if self.fail:
            raise RendezvousBackendError("no answer")
        self.reads += 1
        return {i: (7 if i == "c" else self.reads) for i in ids}


def _handler(min_nodes: int = 3, fail: bool = False) -> Any:
    return SimpleNamespace(
        node_id="a",
        io=Io(fail),
        timeouts=SimpleNamespace(heartbeat_interval=1.0),
        settings=SimpleNamespace(min_nodes=min_nodes),
    )


def test_the_silent_member_is_found_in_three_reads_an_interval_apart() -> None:
    slept: list[float] = []
    handler = _handler()
    assert silent_members(handler, RESULT, sleep=slept.append) == ["c"]
    assert (handler.io.reads, slept) == (3, [1.0, 1.0])
    assert silent_members(_handler(fail=True), RESULT, sleep=slept.append) == []  # nothing known: nothing lost


def test_too_few_left_fails_with_the_lost_hosts_workers(monkeypatch: Any) -> None:
    monkeypatch.setattr("time.sleep", lambda _s: None)
    failures = fatal_losses(_handler(), RESULT, ASSIGNMENT, 1, "slurm")
    assert [(f.rank, f.local_rank, f.host, f.node_id, f.attempt) for f in failures] == [
        (4, 0, "c", "c", 1),
        (5, 1, "c", "c", 1),
    ]
    assert failures[0].reason == (
        "host c was lost (node 'c' stopped heart-beating); 2 node(s) are left, the job needs 3, "
        "and the slurm allocation has no other host"
    )
    assert failures[0].pid == 0  # not known: the report leaves it out
    # an elastic job that still has its minimum goes on
    assert fatal_losses(_handler(min_nodes=2), RESULT, ASSIGNMENT, 1, "slurm") == []
