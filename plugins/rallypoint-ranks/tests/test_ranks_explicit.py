"""The ``explicit`` strategy: node ranks, per-worker global ranks, patterns, and every error."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.agent.ranks import RankAssignment, RankNode, compute_assignment
from rallypoint.core.errors import ConfigError
from rallypoint_ranks.explicit import ExplicitError, ExplicitOptions, ExplicitStrategy


def make(hosts: dict[str, int], **kw: Any) -> list[RankNode]:
    """host -> local world size; group ranks in the order given."""
    return [
        RankNode(node_id=host, group_rank=i, host=host, local_world_size=lws, **kw)
        for i, (host, lws) in enumerate(hosts.items())
    ]


def run(nodes: list[RankNode], hosts: dict[str, Any]) -> RankAssignment:
    return compute_assignment(ExplicitStrategy(), nodes, ExplicitOptions(hosts=hosts))


def ranks(assignment: RankAssignment) -> dict[str, list[int]]:
    return {node_id: [w.rank for w in workers] for node_id, workers in assignment.by_node.items()}


def test_node_ranks() -> None:
    nodes = make({"node7": 2, "node66": 1, "node8": 2})
    assignment = run(nodes, {"node66": 0, "node8": 1, "node7": 2})
    assert ranks(assignment) == {"node66": [0], "node8": [1, 2], "node7": [3, 4]}
    assert assignment.for_node("node7")[0].group_rank == 0  # GROUP_RANK stays the rendezvous's


def test_worker_ranks_need_not_be_contiguous() -> None:
    nodes = make({"node7": 2, "node66": 2}, role="trainer")
    assignment = run(nodes, {"node7": [0, 2], "node66": [3, 1]})
    assert ranks(assignment) == {"node7": [0, 2], "node66": [3, 1]}
    assert [w.role_rank for w in assignment] == [0, 1, 2, 3]


def test_patterns_and_exact_names() -> None:
    nodes = make({"node7.cluster": 1, "node66.cluster": 1, "login": 1})
    assignment = run(nodes, {"node7.*": 0, "node6[0-9].cluster": 2, "login": 1})
    assert ranks(assignment) == {"node7.cluster": [0], "login": [1], "node66.cluster": [2]}
    # an exact name wins over a matching pattern
    assignment = run(make({"a1": 1, "a2": 1}), {"a*": 1, "a2": 0})
    assert ranks(assignment) == {"a1": [1], "a2": [0]}


ERRORS = [
    pytest.param(
        {"a": 1, "b": 1},
        {"a": 0},
        "host 'b' matches no entry of ranks.options.hosts (entries: 'a'); add an entry for it",
        ("b", None),
        id="unknown-host",
    ),
    pytest.param(
        {"a": 1},
        {"a": 0, "c": 1},
        "entry 'c' of ranks.options.hosts applies to no host that joined (hosts: 'a'); remove it, or wait for "
        "that host to join",
        (None, "c"),
        id="entry-without-host",
    ),
    pytest.param(
        {"ab": 1, "b": 1},
        {"a*": 0, "*b": 1, "b": 2},
        "host 'ab' matches several entries of ranks.options.hosts: 'a*', '*b'; add an exact entry for it or make "
        "the patterns disjoint",
        ("ab", "a*"),
        id="ambiguous-patterns",
    ),
    pytest.param(
        {"a1": 1, "a2": 1},
        {"a*": 0},
        "node rank 0 is given to both host 'a1' (entry 'a*') and host 'a2' (entry 'a*')",
        ("a2", "a*"),
        id="pattern-matches-two-hosts",
    ),
    pytest.param(
        {"a": 1, "b": 1, "c": 1},
        {"a": 0, "b": 1, "c": 3},
        "host 'c': entry 'c' gives node rank 3, but node ranks must be 0..2 (3 node(s) joined); ranks given to "
        "nobody: 2",
        ("c", "c"),
        id="node-rank-gap",
    ),
    pytest.param(
        {"a": 2, "b": 2},
        {"a": [0, 1], "b": [2]},
        "host 'b': entry 'b' lists 1 global rank(s) but the node runs 2 worker(s) (local_world_size); give one "
        "rank per local worker",
        ("b", "b"),
        id="size-mismatch",
    ),
    pytest.param(
        {"a": 2, "b": 2},
        {"a": [0, 1], "b": [2, 4]},
        "host 'b' local rank 1: entry 'b' gives global rank 4, but global ranks must be 0..3 (world size 4); "
        "ranks given to nobody: 3",
        ("b", "b"),
        id="global-rank-gap",
    ),
    pytest.param(
        {"h1": 1, "h2": 1},
        {"h*": [0]},
        "global rank 0 is given to both host 'h1' local rank 0 (entry 'h*') and host 'h2' local rank 0 (entry 'h*')",
        ("h2", "h*"),
        id="global-rank-duplicate",
    ),
]


@pytest.mark.parametrize(("lws", "hosts", "detail", "where"), ERRORS)
def test_errors_name_host_and_entry(
    lws: dict[str, int], hosts: dict[str, Any], detail: str, where: tuple[str | None, str | None]
) -> None:
    with pytest.raises(ExplicitError) as info:
        run(make(lws), hosts)
    assert info.value.detail == detail
    assert str(info.value) == f"rank strategy 'explicit' failed: {detail}"
    assert (info.value.host, info.value.entry) == where
    assert info.value.exit_code == 2


def test_two_nodes_on_one_host_cannot_share_an_entry() -> None:
    nodes = [
        RankNode(node_id="x", group_rank=0, host="h", local_world_size=1),
        RankNode(node_id="y", group_rank=1, host="h", local_world_size=1),
    ]
    with pytest.raises(ExplicitError, match=r"node rank 0 is given to both host 'h' \(node 'x'\)"):
        run(nodes, {"h": 0})


@pytest.mark.parametrize(
    ("options", "key", "message"),
    [
        ({}, "ranks.options.hosts", "required key is missing"),
        ({"hosts": {}}, "ranks.options.hosts", "at least 1 item"),
        ({"hosts": {"a": 0, "b": [1]}}, "ranks.options", "entry 'b' is a list of global ranks but entry 'a' is"),
        ({"hosts": {"a": 0, "b": 0}}, "ranks.options", "node rank 0 is given by both entries 'a' and 'b'"),
        ({"hosts": {"a": [0, 0]}}, "ranks.options", "global rank 0 appears twice in entry 'a'"),
        ({"hosts": {"a": -1}}, "ranks.options.hosts.a", "must be at least 0, got -1"),
        ({"hosts": {"a": []}}, "ranks.options.hosts.a", "at least 1 item"),
        ({"hosts": {"a": 0}, "extra": 1}, "ranks.options.extra", "unknown key 'extra' (known keys: hosts)"),
    ],
)
def test_options_are_validated_up_front(options: dict[str, Any], key: str, message: str, resolve_options: Any) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_options("explicit", options)
    assert any(issue.key.startswith(key) and message in issue.message for issue in info.value.issues), [
        str(i) for i in info.value.issues
    ]


def test_missing_options() -> None:
    with pytest.raises(ExplicitError, match="it needs a map of host to ranks"):
        ExplicitStrategy().assign(make({"a": 1}), None)
