"""Launch environments: Slurm's host lists, detection, and what is filled in (flags and job keys win)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rallypoint.agent.launch import HostListError, expand_hostlist, kubernetes, launch_overrides, slurm
from rallypoint.core.config import load_job_config
from rallypoint.core.plugins import get_plugin_manager

TABLE = [
    ("node1", ["node1"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("a,b[1-2]", ["a", "b1", "b2"]),
    ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("x[1-2]-ib,y", ["x1-ib", "x2-ib", "y"]),
    ("n[007-009]", ["n007", "n008", "n009"]),
]


@pytest.mark.parametrize(("text", "hosts"), TABLE)
def test_hostlist_table(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[1-2", "n1-2]", "n[[1]]", "n[2-1]", "n[a-b]", "a,,b", "", "n[1-99999999]"])
def test_hostlist_refuses_malformed(text: str) -> None:
    with pytest.raises(HostListError):
        expand_hostlist(text)


@given(
    st.from_regex(r"[a-z]{1,5}", fullmatch=True),
    st.lists(st.integers(0, 500), min_size=1, max_size=20, unique=True),
    st.integers(1, 4),
)
def test_hostlist_round_trip(prefix: str, numbers: list[int], width: int) -> None:
    """A bracket list written from numbers expands to exactly those names, padding kept."""
    numbers.sort()
    ranges: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
        if n is not None:
            start = prev = n
    want = [f"{prefix}{n:0{width}d}" for n in numbers]
    assert expand_hostlist(f"{prefix}[{','.join(ranges)}]") == want


SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[03-05]",
    "SLURM_JOB_NUM_NODES": "3",
    "SLURMD_NODENAME": "gpu04",
    "SLURM_NODEID": "1",
    "SLURM_RESTART_COUNT": "2",
    "SLURM_LAUNCH_NODE_IPADDR": "10.9.9.9",
}


def test_slurm_detection() -> None:
    facts = slurm.detect(SLURM)
    assert facts is not None
    assert (facts.nnodes, facts.endpoint_host, facts.run_id) == (3, "gpu03", "slurm-4242")
    assert (facts.node_id, facts.node_rank, facts.restart_count) == ("gpu04", 1, 2)
    assert "10.9.9.9" not in repr(facts)  # the login node is never the endpoint
    assert slurm.detect({"SLURM_JOB_ID": "1"}) is None
    assert slurm.detect({}) is None


def test_kubernetes_detection() -> None:
    env = {
        "JOB_COMPLETION_INDEX": "2",
        "HOSTNAME": "train-2",
        "RALLYPOINT_K8S_NNODES": "4",
        "RALLYPOINT_K8S_SERVICE": "train-svc",
    }
    facts = kubernetes.detect(env)
    assert facts is not None
    assert (facts.nnodes, facts.endpoint_host, facts.run_id, facts.node_rank) == (
        4,
        "train-0.train-svc",
        "k8s-train",
        2,
    )
    assert kubernetes.detect({**env, "HOSTNAME": "other"}) is None
    assert kubernetes.detect({k: v for k, v in env.items() if k != "RALLYPOINT_K8S_NNODES"}) is None


def _loaded(tmp_path: Path, text: str, overrides: list[tuple[str, object, str]] | None = None):  # type: ignore[no-untyped-def]
    job = tmp_path / "job.toml"
    job.write_text('[job]\nentrypoint = "hostname"\n' + text)
    return load_job_config(job, get_plugin_manager(), environ={}, overrides=overrides or [])


def test_fills_in_only_what_was_not_given(tmp_path: Path) -> None:
    facts = slurm.detect(SLURM)
    assert facts is not None
    filled = {k: v for k, v, _ in launch_overrides(_loaded(tmp_path, ""), facts, 29400)}
    assert filled == {
        "nodes.min": 3,
        "nodes.max": 3,
        "rendezvous.run_id": "slurm-4242",
        "rendezvous.backend": "grpc",
        "rendezvous.options.endpoint": "gpu03:29400",
    }
    # an elastic job: min from the file, max from the allocation
    elastic = {k: v for k, v, _ in launch_overrides(_loaded(tmp_path, "[nodes]\nmin = 2\n"), facts, 29400)}
    assert elastic["nodes.max"] == 3
    assert "nodes.min" not in elastic
    # a job naming etcd keeps it and its endpoint
    etcd = _loaded(tmp_path, '[rendezvous]\nbackend = "etcd"\n[rendezvous.options]\nendpoints = ["http://e:2379"]\n')
    keys = {k for k, _, _ in launch_overrides(etcd, facts, 29400)}
    assert "rendezvous.backend" not in keys
    assert "rendezvous.options.endpoint" not in keys
    # a flag wins
    flagged = _loaded(tmp_path, "", [("rendezvous.run_id", "mine", "--run-id (command line)")])
    assert "rendezvous.run_id" not in {k for k, _, _ in launch_overrides(flagged, facts, 29400)}
