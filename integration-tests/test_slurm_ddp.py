"""The DDP example as a Slurm batch job: ``srun rallypoint run job.toml``, no rendezvous flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm_jobs import SlurmDdpJob


def test_sbatch_three_node_ddp_with_no_flags(slurm: Any, tmp_path: Path) -> None:
    cluster = slurm(3)
    job = SlurmDdpJob(cluster, tmp_path, nodes=3)
    job.submit()
    state = job.wait_end(timeout=90)
    assert state == "COMPLETED", job.output()[-4000:]
    starts = job.starts()
    assert sorted(s["rank"] for s in starts) == [0, 1, 2], starts
    assert {s["world"] for s in starts} == {3}
    assert {s["host"] for s in starts} == {"node1", "node2", "node3"}
    assert (job.out / "final.json").exists()
    assert job.progress()[-1]["step"] == 30
