"""Property tests: for any participants each strategy returns a valid assignment (or its own clear
error), and every agent computes the same result from the same inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rallypoint.agent.ranks import RankAssignment, RankNode, compute_assignment, validate_assignment
from rallypoint_ranks.env import EnvOptions, EnvRanksError, EnvStrategy
from rallypoint_ranks.explicit import ExplicitError, ExplicitOptions, ExplicitStrategy
from rallypoint_ranks.topology import TopologyOptions, TopologyStrategy

ROLES = ("default", "trainer", "eval")
HOSTS = [f"node{i}" for i in (1, 2, 7, 8, 10, 66, 100)] + ["gpu-a", "gpu-b", "Node3"]


def copy(node: RankNode, **changes: Any) -> RankNode:
    fields = {
        "node_id": node.node_id,
        "group_rank": node.group_rank,
        "host": node.host,
        "local_world_size": node.local_world_size,
        "role": node.role,
        "labels": dict(node.labels),
        "env": dict(node.env),
        "previous_rank": node.previous_rank,
    }
    fields.update(changes)
    return RankNode(**fields)


def assert_same_everywhere(strategy: Any, nodes: list[RankNode], options: Any, shuffled: list[RankNode]) -> None:
    """Another agent sees the same participants in another order, as fresh objects."""
    first = compute_assignment(strategy, nodes, options)
    second = compute_assignment(strategy, [copy(n) for n in shuffled], options)
    assert first == second
    assert first.workers == second.workers


@st.composite
def participants(draw: st.DrawFn, *, unique_hosts: bool = False, max_nodes: int = 8) -> list[RankNode]:
    """Nodes with random ids, hosts (possibly shared), per-host labels, sizes, roles, previous ranks."""
    count = draw(st.integers(1, max_nodes))
    ids = draw(st.lists(st.text("abcdef0123", min_size=1, max_size=4), min_size=count, max_size=count, unique=True))
    if unique_hosts:
        hosts = draw(st.lists(st.sampled_from(HOSTS), min_size=count, max_size=count, unique=True))
    else:
        hosts = draw(st.lists(st.sampled_from(HOSTS[:5]), min_size=count, max_size=count))
    host_labels = {
        host: draw(
            st.fixed_dictionaries(
                {},
                optional={"zone": st.sampled_from(["z1", "z2"]), "rack": st.sampled_from(["r1", "r2", "r10"])},
            )
        )
        for host in set(hosts)
    }
    group_ranks = draw(st.permutations(range(count)))
    return [
        RankNode(
            node_id=node_id,
            group_rank=group_rank,
            host=host,
            local_world_size=draw(st.integers(1, 4)),
            role=draw(st.sampled_from(ROLES)),
            labels=host_labels[host],
            previous_rank=draw(st.none() | st.integers(0, 30)),
        )
        for node_id, host, group_rank in zip(ids, hosts, group_ranks, strict=True)
    ]


topology_options = st.builds(
    TopologyOptions,
    order=st.sampled_from([["zone", "rack"], ["rack"], ["rack", "host"], [], ["zone", "switch", "rack"]]),
    stable=st.booleans(),
)


# ---------------------------------------------------------------------------------------------
# topology


@settings(max_examples=80, deadline=None)
@given(participants(), topology_options, st.data())
def test_topology_is_valid_and_order_independent(nodes: list[RankNode], options: TopologyOptions, data: Any) -> None:
    assert_same_everywhere(TopologyStrategy(), nodes, options, data.draw(st.permutations(nodes)))


@settings(max_examples=80, deadline=None)
@given(participants(), topology_options)
def test_topology_first_round_keeps_hosts_contiguous(nodes: list[RankNode], options: TopologyOptions) -> None:
    nodes = [copy(n, previous_rank=None) for n in nodes]
    assignment = compute_assignment(TopologyStrategy(), nodes, options)
    host_of = {n.node_id: n.host for n in nodes}
    sequence = [host_of[w.node_id] for w in assignment]
    runs = [h for i, h in enumerate(sequence) if i == 0 or sequence[i - 1] != h]
    assert len(runs) == len(set(runs)), sequence


def first_ranks(assignment: RankAssignment) -> dict[str, int]:
    return {node_id: workers[0].rank for node_id, workers in assignment.by_node.items()}


def next_round(
    previous: list[RankNode], assignment: RankAssignment, keep: list[bool], new: list[int]
) -> list[RankNode]:
    ranks = first_ranks(assignment)
    survivors = [copy(n, previous_rank=ranks[n.node_id]) for n, k in zip(previous, keep, strict=True) if k]
    newcomers = [
        RankNode(node_id=f"new{i}", group_rank=0, host=f"spare{i}", local_world_size=size) for i, size in enumerate(new)
    ]
    everyone = survivors + newcomers
    return [copy(n, group_rank=i) for i, n in enumerate(everyone)]


@settings(max_examples=80, deadline=None)
@given(participants(unique_hosts=True), st.data())
def test_topology_re_rendezvous_is_stable(nodes: list[RankNode], data: Any) -> None:
    options = TopologyOptions(order=["zone", "rack"])
    nodes = [copy(n, previous_rank=None) for n in nodes]
    before = compute_assignment(TopologyStrategy(), nodes, options)
    keep = data.draw(st.lists(st.booleans(), min_size=len(nodes), max_size=len(nodes)))
    new = data.draw(st.lists(st.integers(1, 4), max_size=3))
    assume(any(keep) or new)
    after_nodes = next_round(nodes, before, keep, new)
    after = compute_assignment(TopologyStrategy(), after_nodes, options)
    old, now = first_ranks(before), first_ranks(after)
    survivors = [n.node_id for n, k in zip(nodes, keep, strict=True) if k]
    # survivors keep their relative order
    assert sorted(survivors, key=old.__getitem__) == sorted(survivors, key=now.__getitem__)
    if all(keep):  # only joins: nobody moves
        assert all(now[s] == old[s] for s in survivors)
    if not new:  # only departures: everyone before the first departed node stays
        departed_first = min((old[n.node_id] for n, k in zip(nodes, keep, strict=True) if not k), default=None)
        for s in survivors:
            if departed_first is None or old[s] < departed_first:
                assert now[s] == old[s]


@settings(max_examples=100, deadline=None)
@given(participants(unique_hosts=True, max_nodes=6), st.data())
def test_topology_replacing_one_node_keeps_every_rank(nodes: list[RankNode], data: Any) -> None:
    nodes = [copy(n, previous_rank=None) for n in nodes]
    before = compute_assignment(TopologyStrategy(), nodes, None)
    gone = data.draw(st.integers(0, len(nodes) - 1))
    keep = [i != gone for i in range(len(nodes))]
    after = compute_assignment(
        TopologyStrategy(), next_round(nodes, before, keep, [nodes[gone].local_world_size]), None
    )
    old, now = first_ranks(before), first_ranks(after)
    assert all(now[n.node_id] == old[n.node_id] for n, k in zip(nodes, keep, strict=True) if k)
    assert now["new0"] == old[nodes[gone].node_id]


# ---------------------------------------------------------------------------------------------
# explicit


@settings(max_examples=80, deadline=None)
@given(participants(unique_hosts=True), st.booleans(), st.data())
def test_explicit_map_is_followed(nodes: list[RankNode], per_worker: bool, data: Any) -> None:
    if per_worker:
        world = sum(n.local_world_size for n in nodes)
        ranks = data.draw(st.permutations(range(world)))
        hosts: dict[str, Any] = {}
        start = 0
        for n in nodes:
            hosts[n.host] = list(ranks[start : start + n.local_world_size])
            start += n.local_world_size
    else:
        order = data.draw(st.permutations(range(len(nodes))))
        hosts = {n.host: rank for n, rank in zip(nodes, order, strict=True)}
    options = ExplicitOptions(hosts=hosts)
    assignment = compute_assignment(ExplicitStrategy(), nodes, options)
    if per_worker:
        assert {n.node_id: [w.rank for w in assignment.for_node(n.node_id)] for n in nodes} == {
            n.node_id: hosts[n.host] for n in nodes
        }
    else:
        by_rank = sorted(nodes, key=lambda n: hosts[n.host])
        assert [w.node_id for w in assignment] == [n.node_id for n in by_rank for _ in range(n.local_world_size)]
    assert_same_everywhere(ExplicitStrategy(), nodes, options, data.draw(st.permutations(nodes)))


explicit_values = st.integers(0, 12) | st.lists(st.integers(0, 12), min_size=1, max_size=4)


@settings(max_examples=120, deadline=None)
@given(
    participants(),
    st.dictionaries(st.sampled_from([*HOSTS[:6], "node*", "node[0-9]", "gpu-?", "*"]), explicit_values, min_size=1),
)
def test_explicit_any_map_is_valid_or_a_clear_error(nodes: list[RankNode], hosts: dict[str, Any]) -> None:
    try:
        options = ExplicitOptions.model_validate({"hosts": hosts})
    except ValueError:  # pydantic's ValidationError: reported as a ConfigError by the agent
        return
    try:
        assignment = compute_assignment(ExplicitStrategy(), nodes, options)
    except ExplicitError as error:
        failure: ExplicitError | None = error
    else:
        failure = None
        validate_assignment(assignment, nodes, "explicit")
    if failure is not None:
        assert failure.host or failure.entry, failure


# ---------------------------------------------------------------------------------------------
# env

FAMILY_VARS = {
    "torch": ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    "slurm": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    "ompi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
}


@settings(max_examples=80, deadline=None)
@given(participants(unique_hosts=True), st.sampled_from(sorted(FAMILY_VARS)), st.booleans(), st.data())
def test_env_follows_a_consistent_scheduler(nodes: list[RankNode], family: str, worker: bool, data: Any) -> None:
    rank_var, local_var, size_var = FAMILY_VARS[family]
    order = data.draw(st.permutations(nodes))
    starts: dict[str, int] = {}
    base = 0
    for i, n in enumerate(order):
        starts[n.node_id] = base if worker else i
        base += n.local_world_size
    size = base if worker else len(nodes)
    nodes = [
        copy(n, env={rank_var: str(starts[n.node_id]), size_var: str(size), local_var: "0", "SLURM_JOB_ID": "1"})
        for n in nodes
    ]
    options = EnvOptions(level="worker" if worker else "node")
    assignment = compute_assignment(EnvStrategy(), nodes, options)
    expected = [n.node_id for n in order for _ in range(n.local_world_size)]
    assert [w.node_id for w in assignment] == expected
    assert compute_assignment(EnvStrategy(), nodes, EnvOptions()) == assignment  # auto finds the same
    assert_same_everywhere(EnvStrategy(), nodes, options, data.draw(st.permutations(nodes)))


env_values = st.sampled_from(["0", "1", "2", "3", "4", "8", "-1", "x", " 2 "])


@settings(max_examples=120, deadline=None)
@given(
    participants(),
    st.data(),
    st.sampled_from(["auto", "torch", "slurm", "ompi"]),
    st.sampled_from(["auto", "node", "worker"]),
)
def test_env_any_environment_is_valid_or_a_clear_error(
    nodes: list[RankNode], data: Any, source: str, level: str
) -> None:
    names = [v for vs in FAMILY_VARS.values() for v in vs]
    nodes = [copy(n, env=data.draw(st.dictionaries(st.sampled_from(names), env_values))) for n in nodes]
    try:
        assignment = compute_assignment(EnvStrategy(), nodes, EnvOptions(source=source, level=level))  # type: ignore[arg-type]
    except EnvRanksError as error:
        message = str(error)
        assert message.startswith("rank strategy 'env' failed: "), message
        return
    validate_assignment(assignment, nodes, "env")


# ---------------------------------------------------------------------------------------------
# Same inputs, separate processes (different hash seeds): the same assignment.

SCRIPT = """
import json, random
from rallypoint.agent.ranks import RankNode, compute_assignment
from rallypoint.core.plugins import get_plugin_manager
from rallypoint.agent.records import RANK_STRATEGIES

registry = get_plugin_manager().registry(RANK_STRATEGIES)
rng = random.Random(42)
out = []
for case in range(40):
    count = rng.randint(1, 8)
    hosts = rng.sample([f"node{i}" for i in range(1, 80)], count)
    order = list(range(count))
    rng.shuffle(order)
    nodes = []
    for i, host in enumerate(hosts):
        labels = {"rack": rng.choice(["r1", "r2", "r10"])} if rng.random() < 0.7 else {}
        env = {"SLURM_PROCID": str(order[i]), "SLURM_NTASKS": str(count)}
        nodes.append(RankNode(node_id=f"id{i}", group_rank=i, host=host,
                              local_world_size=rng.randint(1, 4), role=rng.choice(["a", "b"]), labels=labels,
                              env=env, previous_rank=rng.choice([None, rng.randint(0, 20)])))
    rng.shuffle(nodes)
    explicit = {n.host: order[i] for i, n in enumerate(sorted(nodes, key=lambda n: n.node_id))}
    for name, raw in [("topology", {"order": ["rack"]}), ("explicit", {"hosts": explicit}), ("env", {})]:
        record = registry.get(name)
        a = compute_assignment(record, nodes, record.options_model.model_validate(raw))
        out.append([name, [[w.node_id, w.local_rank, w.rank, w.role_rank] for w in a]])
print(json.dumps(out))
"""


def test_separate_processes_agree(tmp_path: Path) -> None:
    script = tmp_path / "agents.py"
    script.write_text(textwrap.dedent(SCRIPT))
    outputs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(json.loads(proc.stdout))
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) == 120
