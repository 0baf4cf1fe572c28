"""The ``topology`` strategy: label order, natural host order, stability across rounds, errors."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.agent.ranks import RankAssignment, RankNode, compute_assignment
from rallypoint.core.errors import ConfigError
from rallypoint_ranks.common import natural_key
from rallypoint_ranks.topology import (
    TopologyError,
    TopologyOptions,
    TopologyStrategy,
    effective_labels,
    topology_order,
)


def nodes_of(*specs: tuple[str, int, dict[str, str]], lws: int = 2, **kw: Any) -> list[RankNode]:
    """One node per (host, previous_rank or -1, labels), group ranks in the order given."""
    return [
        RankNode(
            node_id=f"id-{host}",
            group_rank=i,
            host=host,
            local_world_size=lws,
            labels=labels,
            previous_rank=None if prev < 0 else prev,
            **kw,
        )
        for i, (host, prev, labels) in enumerate(specs)
    ]


def first_ranks(assignment: RankAssignment) -> dict[str, int]:
    return {node_id: workers[0].rank for node_id, workers in assignment.by_node.items()}


def hosts_in_order(assignment: RankAssignment) -> list[str]:
    seen: list[str] = []
    for w in assignment:
        host = w.node_id.removeprefix("id-")
        if not seen or seen[-1] != host:
            seen.append(host)
    return seen


def run(nodes: list[RankNode], **options: Any) -> RankAssignment:
    return compute_assignment(TopologyStrategy(), nodes, TopologyOptions(**options))


def test_natural_key() -> None:
    hosts = ["node66", "node7", "node10", "Node8", "node07", "node7.b", "gpu-1", "node"]
    assert sorted(hosts, key=natural_key) == [
        "gpu-1",
        "node",
        "node7",
        "node07",
        "node7.b",
        "Node8",
        "node10",
        "node66",
    ]


def test_natural_host_order_without_labels() -> None:
    nodes = nodes_of(("node66", -1, {}), ("node7", -1, {}), ("node10", -1, {}))
    assignment = run(nodes)
    assert hosts_in_order(assignment) == ["node7", "node10", "node66"]
    assert [w.rank for w in assignment.for_node("id-node7")] == [0, 1]
    # GROUP_RANK stays the rendezvous's
    assert {w.group_rank for w in assignment.for_node("id-node7")} == {1}


def test_labels_then_host() -> None:
    nodes = nodes_of(
        ("node7", -1, {"rack": "r2"}),
        ("node66", -1, {"rack": "r1"}),
        ("node10", -1, {"rack": "r1"}),
        ("node8", -1, {"rack": "r2"}),
        ("node9", -1, {"rack": "r10"}),
    )
    assert hosts_in_order(run(nodes, order=["rack"])) == ["node10", "node66", "node7", "node8", "node9"]
    # "host" may be written as the last entry
    assert hosts_in_order(run(nodes, order=["rack", "host"])) == ["node10", "node66", "node7", "node8", "node9"]


def test_coarsest_label_first_and_missing_last() -> None:
    nodes = nodes_of(
        ("a1", -1, {"zone": "z2", "rack": "r1"}),
        ("a2", -1, {"zone": "z1", "rack": "r2"}),
        ("a3", -1, {"zone": "z1", "rack": "r1"}),
        ("a4", -1, {"zone": "z1"}),
        ("a5", -1, {}),
    )
    assert hosts_in_order(run(nodes, order=["zone", "rack"])) == ["a3", "a2", "a4", "a1", "a5"]


def test_missing_label_error_names_host_and_label() -> None:
    nodes = nodes_of(("a1", -1, {"rack": "r1"}), ("a2", -1, {}))
    with pytest.raises(TopologyError) as info:
        run(nodes, order=["rack"], missing="error")
    assert info.value.host == "a2"
    assert info.value.entry == "rack"
    assert str(info.value).startswith("rank strategy 'topology' failed: host 'a2' (node 'id-a2') has no label 'rack'")
    assert info.value.exit_code == 2


def test_options_hosts_override_published_labels() -> None:
    nodes = nodes_of(("gpu-a1", -1, {"rack": "z"}), ("gpu-b1", -1, {"rack": "a"}), ("gpu-a2", -1, {}))
    options = {"order": ["rack"], "hosts": {"gpu-a*": {"rack": "b"}, "gpu-a2": "rack=0"}}
    assert hosts_in_order(compute_assignment(TopologyStrategy(), nodes, TopologyOptions(**options))) == [
        "gpu-a2",
        "gpu-b1",
        "gpu-a1",
    ]
    assert effective_labels(nodes[0], TopologyOptions(**options)) == {"rack": "b"}


def test_nodes_on_one_host_are_adjacent_and_must_agree() -> None:
    nodes = [
        RankNode(node_id="x2", group_rank=0, host="h1", local_world_size=1),
        RankNode(node_id="y", group_rank=1, host="h0", local_world_size=1),
        RankNode(node_id="x1", group_rank=2, host="h1", local_world_size=1),
    ]
    assert [w.node_id for w in run(nodes)] == ["y", "x1", "x2"]
    clash = [
        RankNode(node_id="x1", group_rank=0, host="h1", local_world_size=1, labels={"rack": "r1"}),
        RankNode(node_id="x2", group_rank=1, host="h1", local_world_size=1, labels={"rack": "r2"}),
    ]
    with pytest.raises(TopologyError, match="nodes 'x1' and 'x2' on host 'h1' have different 'rack' labels"):
        run(clash, order=["rack"])


@pytest.mark.parametrize(
    ("options", "key", "message"),
    [
        ({"order": ["host", "rack"]}, "ranks.options.order", "'host' must be the last entry"),
        ({"order": ["rack", "rack"]}, "ranks.options.order", "label 'rack' appears twice"),
        ({"order": ["9lives"]}, "ranks.options.order", "invalid label name '9lives'"),
        ({"hosts": {"a": {"bad key": "x"}}}, "ranks.options.hosts", "invalid label name 'bad key'"),
        ({"hosts": {"a": "rack"}}, "ranks.options.hosts", "'rack': expected key=value"),
        ({"missing": "first"}, "ranks.options.missing", "'last' or 'error'"),
        ({"stabel": True}, "ranks.options.stabel", "unknown key 'stabel'; did you mean 'stable'?"),
    ],
)
def test_options_are_validated(options: dict[str, Any], key: str, message: str, resolve_options: Any) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_options("topology", options)
    assert any(issue.key == key and message in issue.message for issue in info.value.issues), info.value.issues


# ---------------------------------------------------------------------------------------------
# Re-rendezvous


def four_racked(**kw: Any) -> list[tuple[str, int, dict[str, str]]]:
    return [
        ("node10", 0, {"rack": "r1"}),
        ("node66", 8, {"rack": "r1"}),
        ("node7", 16, {"rack": "r2"}),
        ("node8", 24, {"rack": "r2"}),
    ]


def test_docs_example_first_round() -> None:
    nodes = nodes_of(*[(h, -1, lab) for h, _, lab in four_racked()], lws=8)
    assert first_ranks(run(nodes, order=["rack"])) == {"id-node10": 0, "id-node66": 8, "id-node7": 16, "id-node8": 24}


def test_replacement_fills_the_hole_and_everyone_keeps_ranks() -> None:
    specs = [s for s in four_racked() if s[0] != "node66"] + [("node12", -1, {"rack": "r1"})]
    assignment = run(nodes_of(*specs, lws=8), order=["rack"])
    assert first_ranks(assignment) == {"id-node10": 0, "id-node12": 8, "id-node7": 16, "id-node8": 24}


def test_scale_down_compacts_in_the_same_order() -> None:
    specs = [s for s in four_racked() if s[0] != "node66"]
    assignment = run(nodes_of(*specs, lws=8), order=["rack"])
    assert first_ranks(assignment) == {"id-node10": 0, "id-node7": 8, "id-node8": 16}


def test_scale_up_appends_newcomers_in_topology_order() -> None:
    specs = [*four_racked(), ("node9", -1, {"rack": "r1"}), ("node3", -1, {"rack": "r2"})]
    assignment = run(nodes_of(*specs, lws=8), order=["rack"])
    assert hosts_in_order(assignment) == ["node10", "node66", "node7", "node8", "node9", "node3"]
    # with stable = false, the job is sorted afresh
    fresh = run(nodes_of(*specs, lws=8), order=["rack"], stable=False)
    assert hosts_in_order(fresh) == ["node9", "node10", "node66", "node3", "node7", "node8"]


def test_hole_is_filled_first_fit_in_topology_order() -> None:
    nodes = [
        RankNode(node_id="s0", group_rank=0, host="s0", local_world_size=2, previous_rank=0),
        RankNode(node_id="s1", group_rank=1, host="s1", local_world_size=2, previous_rank=5),
        RankNode(node_id="n-big", group_rank=2, host="a-big", local_world_size=4),
        RankNode(node_id="n-one", group_rank=3, host="b-one", local_world_size=1),
        RankNode(node_id="n-two", group_rank=4, host="c-two", local_world_size=2),
    ]
    # hole of 3 after s0: a-big (4) does not fit; b-one (1) and c-two (2) do, in topology order.
    assert [w.node_id for w in run(nodes)][::1] == ["s0", "s0", "n-one", "n-two", "n-two", "s1", "s1"] + ["n-big"] * 4


def test_overlapping_previous_ranks_keep_relative_order() -> None:
    # A node that grew: its old block overlaps the next survivor's; both move as needed.
    nodes = [
        RankNode(node_id="a", group_rank=0, host="z", local_world_size=4, previous_rank=0),
        RankNode(node_id="b", group_rank=1, host="y", local_world_size=2, previous_rank=2),
        RankNode(node_id="c", group_rank=2, host="x", local_world_size=2, previous_rank=2),
    ]
    assert [n.node_id for n in topology_order(nodes)] == ["a", "c", "b"]  # tie on 2: topology key (host x < y)
    run(nodes)  # valid


def test_strategy_without_options_uses_defaults() -> None:
    nodes = nodes_of(("b", -1, {}), ("a", -1, {}))
    assert hosts_in_order(TopologyStrategy().assign(nodes, None)) == ["a", "b"]
