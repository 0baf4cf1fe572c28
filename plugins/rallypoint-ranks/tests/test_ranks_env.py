"""The ``env`` strategy: ranks from Slurm, Open MPI or torch-style variables, checked across nodes."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.agent.ranks import RankAssignment, RankNode, compute_assignment
from rallypoint.core.errors import ConfigError
from rallypoint_ranks.env import EnvOptions, EnvRanksError, EnvStrategy


def make(*envs: dict[str, str], lws: int | list[int] = 2) -> list[RankNode]:
    sizes = lws if isinstance(lws, list) else [lws] * len(envs)
    return [
        RankNode(node_id=f"n{i}", group_rank=i, host=f"host{i}", local_world_size=size, env=env)
        for i, (env, size) in enumerate(zip(envs, sizes, strict=True))
    ]


def slurm(rank: int, size: int, local: int = 0) -> dict[str, str]:
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(size), "SLURM_LOCALID": str(local), "SLURM_JOB_ID": "7"}


def run(nodes: list[RankNode], **options: Any) -> RankAssignment:
    return compute_assignment(EnvStrategy(), nodes, EnvOptions(**options))


def first_ranks(assignment: RankAssignment) -> dict[str, int]:
    return {node_id: workers[0].rank for node_id, workers in assignment.by_node.items()}


def test_slurm_node_level() -> None:
    nodes = make(slurm(2, 3), slurm(0, 3), slurm(1, 3))
    assert first_ranks(run(nodes)) == {"n1": 0, "n2": 2, "n0": 4}


def test_node_level_group_rank_is_the_schedulers_node_rank() -> None:
    """One task per node: GROUP_RANK is the node's task rank (torchrun's static rendezvous: --node-rank)."""
    nodes = make(slurm(2, 3), slurm(0, 3), slurm(1, 3))  # rendezvous group ranks 0, 1, 2
    group = {node_id: {w.group_rank for w in workers} for node_id, workers in run(nodes).by_node.items()}
    assert group == {"n1": {0}, "n2": {1}, "n0": {2}}
    # At worker level too: the nodes' order in the scheduler's ranks (so the two levels agree
    # where they coincide, one worker per node).
    workers = make(slurm(6, 8), slurm(0, 8), slurm(4, 8), lws=[2, 4, 2])
    group = {node_id: {w.group_rank for w in ws} for node_id, ws in run(workers, level="worker").by_node.items()}
    assert group == {"n1": {0}, "n2": {1}, "n0": {2}}


def test_torch_and_ompi_families() -> None:
    torch = make({"RANK": "1", "WORLD_SIZE": "2"}, {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert first_ranks(run(torch)) == {"n1": 0, "n0": 2}
    ompi = make(
        {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
        {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
    )
    assert first_ranks(run(ompi, source="ompi")) == {"n1": 0, "n0": 2}


def test_worker_level_uses_the_schedulers_ranks() -> None:
    # 8 tasks over nodes of 4, 2 and 2 workers; the agent runs in each node's first task.
    nodes = make(slurm(6, 8), slurm(0, 8), slurm(4, 8), lws=[2, 4, 2])
    assert first_ranks(run(nodes)) == {"n1": 0, "n2": 4, "n0": 6}
    assert first_ranks(run(nodes, level="worker")) == {"n1": 0, "n2": 4, "n0": 6}


def test_auto_agrees_when_families_agree_and_refuses_when_they_do_not() -> None:
    same = make({**slurm(1, 2), "RANK": "1", "WORLD_SIZE": "2"}, {**slurm(0, 2), "RANK": "0", "WORLD_SIZE": "2"})
    assert first_ranks(run(same)) == {"n1": 0, "n0": 2}
    differ = make({**slurm(1, 2), "RANK": "0", "WORLD_SIZE": "2"}, {**slurm(0, 2), "RANK": "1", "WORLD_SIZE": "2"})
    with pytest.raises(EnvRanksError) as info:
        run(differ)
    assert info.value.detail == (
        "host 'host0' (node 'n0') has conflicting scheduler ranks: RANK=0 WORLD_SIZE=2 but SLURM_PROCID=1 "
        "SLURM_NTASKS=2; set [ranks.options] source = 'torch' or 'slurm'"
    )
    assert first_ranks(run(differ, source="slurm")) == {"n1": 0, "n0": 2}


def test_slurm_nprocs_fallback() -> None:
    nodes = make({"SLURM_PROCID": "1", "SLURM_NPROCS": "2"}, {"SLURM_PROCID": "0", "SLURM_NPROCS": "2"})
    assert first_ranks(run(nodes, source="slurm")) == {"n1": 0, "n0": 2}


ERRORS = [
    pytest.param(
        [slurm(0, 2), {}],
        {},
        "host 'host1' (node 'n1') has no scheduler ranks (looked for: RANK and WORLD_SIZE; SLURM_PROCID and "
        "SLURM_NTASKS or SLURM_NPROCS; OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE); start the agent under the "
        "scheduler on every node, or use another rank strategy",
        ("host1", None),
        id="no-variables",
    ),
    pytest.param(
        [slurm(0, 2), {"RANK": "1", "WORLD_SIZE": "2"}],
        {},
        "the nodes have scheduler ranks from different schedulers (host 'host0' (node 'n0'): slurm, host 'host1' "
        "(node 'n1'): torch); no one source",
        (None, None),
        id="mixed-families",
    ),
    pytest.param(
        [slurm(0, 2), {"SLURM_PROCID": "1"}],
        {"source": "slurm"},
        "host 'host1' (node 'n1') has no SLURM_NTASKS or SLURM_NPROCS (source = 'slurm'); start the agent under "
        "the scheduler on every node, or choose another source",
        ("host1", "SLURM_NTASKS or SLURM_NPROCS"),
        id="missing-size",
    ),
    pytest.param(
        [slurm(0, 2), {"SLURM_PROCID": "one", "SLURM_NTASKS": "2"}],
        {},
        "host 'host1' (node 'n1'): SLURM_PROCID='one' is not a non-negative integer",
        ("host1", "SLURM_PROCID"),
        id="not-an-int",
    ),
    pytest.param(
        [slurm(0, 2), slurm(1, 3)],
        {},
        "the nodes disagree on SLURM_NTASKS: 2 on host 'host0' (node 'n0'); 3 on host 'host1' (node 'n1'); "
        "they must come from one scheduler job",
        ("host1", "SLURM_NTASKS"),
        id="sizes-differ",
    ),
    pytest.param(
        [slurm(0, 3), slurm(1, 3)],
        {},
        "SLURM_NTASKS=3 on every node, but 2 node(s) joined running 4 worker(s): it must be the number of nodes "
        "(one scheduler task per node) or the number of workers (one task per worker); did every node join, "
        "with the same nproc_per_node?",
        (None, "SLURM_NTASKS"),
        id="size-fits-nothing",
    ),
    pytest.param(
        [slurm(0, 2), slurm(1, 2)],
        {"level": "worker"},
        "SLURM_NTASKS=2 on every node, but the world size is 4 (level = 'worker')",
        (None, "SLURM_NTASKS"),
        id="size-wrong-for-level",
    ),
    pytest.param(
        [slurm(1, 2), slurm(1, 2)],
        {},
        "host 'host0' (node 'n0') and host 'host1' (node 'n1') both have SLURM_PROCID=1",
        ("host1", "SLURM_PROCID"),
        id="duplicate-rank",
    ),
    pytest.param(
        [slurm(0, 4), slurm(2, 4)],
        {"level": "node"},
        "SLURM_NTASKS=4 on every node, but 2 node(s) joined (level = 'node')",
        (None, "SLURM_NTASKS"),
        id="node-level-size",
    ),
    pytest.param(
        [slurm(0, 4), slurm(1, 4)],
        {},
        "host 'host1' (node 'n1')'s ranks 1..2 (SLURM_PROCID=1) overlap host 'host0' (node 'n0')'s ranks 0..1",
        ("host1", "SLURM_PROCID"),
        id="worker-overlap",
    ),
    pytest.param(
        [slurm(0, 4), slurm(3, 4)],
        {},
        "rank 2 belongs to no node: host 'host1' (node 'n1')'s ranks 3..4 (SLURM_PROCID=3) start after host "
        "'host0' (node 'n0')'s ranks 0..1; with one scheduler task per worker, the agent must run in each node's "
        "first task",
        ("host1", "SLURM_PROCID"),
        id="worker-gap",
    ),
]


@pytest.mark.parametrize(("envs", "options", "detail", "where"), ERRORS)
def test_errors_name_host_and_variable(
    envs: list[dict[str, str]], options: dict[str, Any], detail: str, where: tuple[str | None, str | None]
) -> None:
    with pytest.raises(EnvRanksError) as info:
        run(make(*envs), **options)
    assert info.value.detail == detail
    assert str(info.value) == f"rank strategy 'env' failed: {detail}"
    assert (info.value.host, info.value.entry) == where


def test_local_ranks_clash_on_one_host() -> None:
    nodes = [
        RankNode(node_id="x", group_rank=0, host="h", local_world_size=1, env=slurm(0, 2, local=0)),
        RankNode(node_id="y", group_rank=1, host="h", local_world_size=1, env=slurm(1, 2, local=0)),
    ]
    with pytest.raises(EnvRanksError, match="nodes 'x' and 'y' on host 'h' both have SLURM_LOCALID=0"):
        run(nodes)
    ok = [
        RankNode(node_id="x", group_rank=0, host="h", local_world_size=1, env=slurm(1, 2, local=1)),
        RankNode(node_id="y", group_rank=1, host="h", local_world_size=1, env=slurm(0, 2, local=0)),
    ]
    assert first_ranks(run(ok)) == {"y": 0, "x": 1}


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"source": "pbs"}, "ranks.options.source"),
        ({"level": "task"}, "ranks.options.level"),
        ({"x": 1}, "ranks.options.x"),
    ],
)
def test_options_are_validated(options: dict[str, Any], key: str, resolve_options: Any) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_options("env", options)
    assert [issue.key for issue in info.value.issues] == [key]


def test_defaults_through_the_registry(registry: Any, resolve_options: Any) -> None:
    options = resolve_options("env", {})
    assert options == EnvOptions()
    assignment = compute_assignment(registry.get("env"), make(slurm(1, 2), slurm(0, 2)), options)
    assert first_ranks(assignment) == {"n1": 0, "n0": 2}
