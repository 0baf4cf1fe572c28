"""Rank strategies end to end: two agents on loopback, workers see the ranks the strategy promised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

WORKER = """
import json, os, sys
keys = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "NODE_TAG")
with open(os.path.join(sys.argv[1], "w" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump({k: os.environ[k] for k in keys}, f)
"""


def _wait_joined(tmp_path: Path, run_id: str, count: int) -> None:
    """Wait until ``count`` nodes joined round 0 (``rallypoint status``), so arrival order is known."""
    if count == 0:
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = subprocess.run(
            [
                *RALLYPOINT,
                "status",
                "--rdzv-backend",
                "file",
                "--rdzv-endpoint",
                str(tmp_path / "rdzv"),
                "--run-id",
                run_id,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if f"joined:    {count}\n" in status.stdout:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} node(s) did not join {run_id!r}")


def run_two_agents(tmp_path: Path, run_id: str, strategy_args: list[str], node_env: dict[str, dict[str, str]]) -> dict:
    out = tmp_path / run_id
    out.mkdir()
    (tmp_path / "worker.py").write_text(WORKER)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "SLURM_"))}
    procs = []
    for joined, (tag, extra) in enumerate(node_env.items()):
        _wait_joined(tmp_path, run_id, joined)  # join in order: the first node is group rank 0
        env = {**base, **extra, "NODE_TAG": tag}
        procs.append(
            subprocess.Popen(
                [
                    *RALLYPOINT,
                    "run",
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "2",
                    "--rdzv-backend",
                    "file",
                    "--rdzv-endpoint",
                    str(tmp_path / "rdzv"),
                    "--run-id",
                    run_id,
                    "--local-addr",
                    "127.0.0.1",
                    "--node-id",
                    tag,
                    "--host-name",
                    f"host-{tag}",
                    *strategy_args,
                    str(tmp_path / "worker.py"),
                    str(out),
                ],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    seen = [json.loads((out / f"w{r}.json").read_text()) for r in range(4)]
    return {tag: sorted(int(s["RANK"]) for s in seen if s["NODE_TAG"] == tag) for tag in node_env} | {
        "group_of_rank0": seen[0]["GROUP_RANK"]
    }


def test_topology_orders_nodes_by_their_labels(tmp_path: Path) -> None:
    args = ["--set", "ranks.strategy=topology", "--set", 'ranks.options.order=["rack"]']
    first = run_two_agents(
        tmp_path,
        "topo1",
        args,
        {"a": {"RALLYPOINT_NODE_LABELS": "rack=r2"}, "b": {"RALLYPOINT_NODE_LABELS": "rack=r1"}},
    )
    second = run_two_agents(
        tmp_path,
        "topo2",
        args,
        {"a": {"RALLYPOINT_NODE_LABELS": "rack=r1"}, "b": {"RALLYPOINT_NODE_LABELS": "rack=r3"}},
    )
    # a joined first (group rank 0), but b's rack sorts first: b gets ranks 0 and 1
    assert first["b"] == [0, 1]
    assert first["a"] == [2, 3]
    assert first["group_of_rank0"] == "1"
    # with the labels the other way round, the order agrees with the arrival order
    assert second["a"] == [0, 1]
    assert second["b"] == [2, 3]
    assert second["group_of_rank0"] == "0"


def test_env_takes_the_ranks_a_scheduler_gave(tmp_path: Path) -> None:
    args = ["--set", "ranks.strategy=env", "--set", 'ranks.options.source="slurm"']
    for run_id, procid in (("slurm1", {"a": "1", "b": "0"}), ("slurm2", {"a": "0", "b": "1"})):
        env = {tag: {"SLURM_PROCID": pid, "SLURM_LOCALID": pid, "SLURM_NTASKS": "2"} for tag, pid in procid.items()}
        seen = run_two_agents(tmp_path, run_id, args, env)
        first = "b" if procid["b"] == "0" else "a"
        second = "a" if first == "b" else "b"
        assert seen[first] == [0, 1]
        assert seen[second] == [2, 3]


def test_env_strategy_conflicts_fail_clearly(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "SLURM_"))}
    procs = [
        subprocess.Popen(
            [
                *RALLYPOINT,
                "run",
                "--nnodes",
                "2",
                "--rdzv-backend",
                "file",
                "--rdzv-endpoint",
                str(tmp_path / "rdzv"),
                "--run-id",
                "clash",
                "--local-addr",
                "127.0.0.1",
                "--node-id",
                tag,
                "--max-restarts",
                "0",
                "--set",
                "ranks.strategy=env",
                str(tmp_path / "worker.py"),
                str(tmp_path),
            ],
            cwd=tmp_path,
            env={**base, "SLURM_PROCID": "0", "SLURM_LOCALID": local, "SLURM_NTASKS": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag, local in (("a", "0"), ("b", "1"))
    ]
    results = [p.communicate(timeout=60) for p in procs]
    # every node stops with the configuration error (exit 2), none waits for the others
    assert [p.returncode for p in procs] == [2, 2], results
    for _, err in results:
        assert "rank strategy 'env' failed" in err
        assert "both have SLURM_PROCID=0" in err
        assert "Traceback" not in err


GROWING = """
import json, os, sys, time
out = sys.argv[1]
rnd = int(os.environ["RALLYPOINT_ROUND"])
with open(os.path.join(out, f"r{rnd}.{os.environ['NODE_TAG']}"), "w") as f:
    f.write(os.environ["RANK"])
if rnd == 0:
    time.sleep(600)  # until the late node arrives
"""


def test_topology_keeps_ranks_stable_when_a_node_joins(tmp_path: Path) -> None:
    """a (rack r2) and b (rack r3) run; c (rack r1) arrives. A fresh sort would put c first;
    stable topology keeps a and b where they were and appends c."""
    (tmp_path / "grow.py").write_text(GROWING)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "SLURM_"))}
    common = [
        "run",
        "--nnodes",
        "2:3",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "file",
        "--rdzv-endpoint",
        str(tmp_path / "rdzv"),
        "--run-id",
        "stable",
        "--local-addr",
        "127.0.0.1",
        "--set",
        "ranks.strategy=topology",
        "--set",
        'ranks.options.order=["rack"]',
        "--set",
        "rendezvous.last_call_timeout=0.3s",
    ]

    def start(tag: str, rack: str) -> subprocess.Popen[str]:
        env = {**base, "NODE_TAG": tag, "RALLYPOINT_NODE_LABELS": f"rack={rack}"}
        return subprocess.Popen(
            [
                *RALLYPOINT,
                *common,
                "--node-id",
                tag,
                "--host-name",
                f"host-{tag}",
                str(tmp_path / "grow.py"),
                str(tmp_path),
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    procs = [start("a", "r2"), start("b", "r3")]
    try:
        deadline = time.monotonic() + 60
        while not ((tmp_path / "r0.a").exists() and (tmp_path / "r0.b").exists()):
            assert time.monotonic() < deadline, "round 0 did not start"
            time.sleep(0.05)
        procs.append(start("c", "r1"))
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0], results
    assert ((tmp_path / "r0.a").read_text(), (tmp_path / "r0.b").read_text()) == ("0", "1")
    final = max(int(p.name.split(".")[0][1:]) for p in tmp_path.glob("r*.c"))
    ranks = {tag: (tmp_path / f"r{final}.{tag}").read_text() for tag in "abc"}
    assert ranks == {"a": "0", "b": "1", "c": "2"}
