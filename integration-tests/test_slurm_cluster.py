"""The Slurm test cluster itself: three slurmd hosts with their own names, jobs run on each."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import netns


def test_srun_runs_one_task_on_every_host_with_its_own_name(slurm: Any) -> None:
    cluster = slurm(3)
    out = cluster.client(["srun", "-N3", "--ntasks-per-node=1", "sh", "-c", 'echo "$(hostname) $SLURM_NODEID"'])
    seen = sorted(line.split() for line in out.stdout.splitlines())
    assert seen == [["node1", "0"], ["node2", "1"], ["node3", "2"]], out.stdout + out.stderr


def test_a_host_name_resolves_to_loopback_on_that_host_only(slurm: Any) -> None:
    cluster = slurm(2)
    out = cluster.client(["srun", "-w", "node1", "getent", "hosts", "node1", "node2"])
    table = {}
    for line in out.stdout.splitlines():
        addr, *names = line.split()
        table.update({name: addr for name in names if name.startswith("node")})
    assert table == {"node1": "127.0.0.1", "node2": cluster.nodes[1].addr}, out.stdout


def test_close_kills_running_jobs_and_removes_the_folder(slurm: Any, tmp_path: Path) -> None:
    cluster = slurm(1)
    script = tmp_path / "sleep.sh"
    script.write_text("#!/bin/sh\nsleep 300\n")
    job = cluster.sbatch(script, f"--output={tmp_path / 'out'}")
    cluster.wait_state(job, ["RUNNING"], timeout=20)
    # RUNNING is slurmctld's word: the batch script may not have started its sleep yet
    deadline = time.monotonic() + 20
    while not (sleepers := _processes_named(cluster.nodes[0], "sleep")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sleepers, "the job's sleep is not running on node1"
    root = cluster.root
    killed = cluster.close()
    assert set(sleepers) <= killed
    assert not any(netns.process_alive(pid) for pid in sleepers)
    assert not root.exists()


def _processes_named(host: Any, name: str) -> list[int]:
    """The pids of ``host``'s processes whose command name is ``name`` (those gone meanwhile skipped)."""
    found = []
    for pid in host.pids():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                found.append(pid)
    return found
