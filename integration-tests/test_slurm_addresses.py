"""Host names that resolve to 127.0.0.1: under Slurm, workers still get the hosts' real addresses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurm_jobs import batch_script

PROBE = Path(__file__).parent / "launch_probe.py"


def test_master_addr_and_gloo_interface_are_the_real_address(slurm: Any, tmp_path: Path) -> None:
    cluster = slurm(2)
    job_file = tmp_path / "job.toml"
    job_file.write_text(f'[job]\nentrypoint = "{PROBE}"\nargs = ["{tmp_path / "out"}"]\n')
    script = tmp_path / "job.sbatch"
    script.write_text(batch_script(2, job_file, log=tmp_path / "slurm-%j.out"))
    job = cluster.sbatch(script, f"--chdir={tmp_path}")
    state = cluster.wait_state(job, ["COMPLETED", "FAILED", "CANCELLED"], timeout=60)
    output = (tmp_path / f"slurm-{job}.out").read_text(errors="replace")
    assert state == "COMPLETED", output[-3000:]
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("rank*.json"))]
    assert [r["RANK"] for r in records] == ["0", "1"], records
    rank0_host = next(n for n in cluster.nodes if n.name == records[0]["host"])
    # node names resolve to 127.0.0.1 on their own host; workers get the bridge address and its interface
    assert {r["MASTER_ADDR"] for r in records} == {rank0_host.addr}, records
    assert {r["GLOO_SOCKET_IFNAME"] for r in records} == {"eth0"}, records
    assert {r["TORCHELASTIC_RUN_ID"] for r in records} == {f"slurm-{job}"}
