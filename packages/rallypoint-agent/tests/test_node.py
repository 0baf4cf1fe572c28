"""Tests of rallypoint.agent.node: node labels, the record a node publishes, and its rank view."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent import ranks
from rallypoint.agent.node import (
    NODE_LABELS_ENV,
    NODE_LABELS_FILE_ENV,
    NodeLabelsError,
    default_node_id,
    node_record,
    parse_node_labels,
    read_node_labels,
)
from rallypoint.agent.ranks import RankNode
from rallypoint.core.errors import RallypointError
from rallypoint.rendezvous.state import NodeInfo

# ---------------------------------------------------------------------------------------------
# Labels


@pytest.mark.parametrize(
    ("text", "labels"),
    [
        ("", {}),
        ("rack=r1,zone=z2", {"rack": "r1", "zone": "z2"}),
        (" rack = r1 , zone=z2 ,, ", {"rack": "r1", "zone": "z2"}),
        (
            "# a labels file\nrack=r1\n\nzone=z2, gpu=h100\n  # indented comment\n",
            {"rack": "r1", "zone": "z2", "gpu": "h100"},
        ),
        ("_a.b-c=some value", {"_a.b-c": "some value"}),
    ],
)
def test_parse_node_labels(text: str, labels: dict[str, str]) -> None:
    assert parse_node_labels(text) == labels


KEY_RULE = "invalid key {!r} (use letters, digits, '_', '.' and '-', starting with a letter)"


@pytest.mark.parametrize(
    ("text", "item", "problem"),
    [
        ("rack=r1,zone", "zone", "expected key=value"),
        ("=r1", "=r1", "the key is empty"),
        ("9rack=r1", "9rack=r1", KEY_RULE.format("9rack")),
        ("ra ck=r1", "ra ck=r1", KEY_RULE.format("ra ck")),
        ("rack=", "rack=", "label 'rack' has an empty value"),
        ("rack=a=b", "rack=a=b", "the value of 'rack' contains '='"),
        ("rack=r1,rack=r2", "rack=r2", "label 'rack' is given twice (first as 'r1')"),
    ],
)
def test_parse_node_labels_errors(text: str, item: str, problem: str) -> None:
    with pytest.raises(NodeLabelsError) as info:
        parse_node_labels(text, source="/etc/labels")
    assert str(info.value) == (
        f"invalid node labels in /etc/labels: {item!r}: {problem}. Write labels as key=value pairs separated by "
        f"commas or new lines, e.g. rack=r1,zone=z2"
    )
    assert (info.value.source, info.value.item) == ("/etc/labels", item)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, RallypointError)
    assert info.value.exit_code == 2


def test_read_node_labels(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "labels"
    path.write_text("rack=r1\nzone=z1\n")
    assert read_node_labels({NODE_LABELS_ENV: "rack=r9,gpu=h100"}, path) == {"rack": "r9", "zone": "z1", "gpu": "h100"}
    assert read_node_labels({}, str(path)) == {"rack": "r1", "zone": "z1"}
    assert read_node_labels({}) == {}
    monkeypatch.setenv(NODE_LABELS_ENV, "rack=r3")
    assert read_node_labels() == {"rack": "r3"}
    with pytest.raises(NodeLabelsError, match=r"invalid node labels in RALLYPOINT_NODE_LABELS: 'rack'"):
        read_node_labels({NODE_LABELS_ENV: "rack"})
    with pytest.raises(NodeLabelsError, match=r"cannot read the labels file"):
        read_node_labels({}, tmp_path / "missing")


def test_labels_are_still_importable_from_ranks() -> None:
    assert ranks.read_node_labels is read_node_labels
    assert ranks.parse_node_labels is parse_node_labels
    assert ranks.NodeLabelsError is NodeLabelsError
    assert ranks.NODE_LABELS_ENV == NODE_LABELS_ENV == "RALLYPOINT_NODE_LABELS"


# ---------------------------------------------------------------------------------------------
# The record a node publishes


def test_node_record(tmp_path: Path) -> None:
    labels_file = tmp_path / "labels"
    labels_file.write_text("rack=r1\nzone=z1\n")
    environ = {
        NODE_LABELS_ENV: "rack=r9",
        NODE_LABELS_FILE_ENV: str(labels_file),
        "SLURM_PROCID": "3",
        "RANK": "3",
        "HOME": "/home/me",
    }
    node = node_record(host="gpu-3", addr="10.0.0.3", local_world_size=8, environ=environ, pid=41)
    assert node == NodeInfo(
        node_id="gpu-3-41",
        host="gpu-3",
        addr="10.0.0.3",
        local_world_size=8,
        labels={"rack": "r9", "zone": "z1"},
        env={"SLURM_PROCID": "3", "RANK": "3"},
    )
    named = node_record(host="gpu-3", addr="gpu-3", local_world_size=1, environ={}, node_id="trainer-0")
    assert (named.node_id, dict(named.labels), dict(named.env)) == ("trainer-0", {}, {})
    assert node_record(host="h", addr="h", local_world_size=1, environ={}).node_id == f"h-{os.getpid()}"
    assert default_node_id("gpu-3", 41) == "gpu-3-41"


def test_node_record_reports_bad_labels(tmp_path: Path) -> None:
    with pytest.raises(NodeLabelsError, match=r"invalid node labels in RALLYPOINT_NODE_LABELS: 'rack'"):
        node_record(host="h", addr="h", local_world_size=1, environ={NODE_LABELS_ENV: "rack"})
    missing = tmp_path / "nope"
    with pytest.raises(NodeLabelsError, match=r"cannot read the labels file") as info:
        node_record(host="h", addr="h", local_world_size=1, environ={NODE_LABELS_FILE_ENV: str(missing)})
    assert info.value.source == str(missing)


# ---------------------------------------------------------------------------------------------
# From the rendezvous record to the strategies' view


def test_rank_node_from_participant() -> None:
    record = NodeInfo(
        node_id="n1",
        host="gpu-1",
        addr="10.0.0.1",
        local_world_size=4,
        labels={"rack": "r1"},
        master_port=29500,
        env={"SLURM_PROCID": "1"},
        previous_rank=8,
    )
    node = RankNode.from_participant(record, 1)
    assert node == RankNode(
        node_id="n1",
        group_rank=1,
        host="gpu-1",
        local_world_size=4,
        labels={"rack": "r1"},
        env={"SLURM_PROCID": "1"},
        previous_rank=8,
    )
    assert RankNode.from_participant(record, 0, role="trainer").role == "trainer"
    fresh = RankNode.from_participant(NodeInfo(node_id="n2", host="h", addr="h"), 2)
    assert (fresh.local_world_size, dict(fresh.labels), dict(fresh.env), fresh.previous_rank) == (1, {}, {}, None)


def test_old_name_of_rank_node_still_imports_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="rallypoint.agent.ranks.NodeInfo is now RankNode"):
        from rallypoint.agent.ranks import NodeInfo as Old
    assert Old is RankNode
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
            ranks.Nothing  # noqa: B018
