"""Hot spares: with ``nodes.max`` reached, an extra host waits; it replaces a host that dies.

The job runs on nodea and nodeb (``--nnodes 1:2``, the ``topology`` rank strategy); nodec
arrives after the round completed and waits as a spare (the members are not disturbed). When
nodea (global rank 0, the workers' store) is killed, the next round has nodeb and nodec: the
world size stays 2, nodeb keeps its rank 1, and nodec takes rank 0, the dead host's place.
The time from the kill to the first step of the new round is recorded next to the same fault
without a spare (``test_faults_multihost.py``: the job shrinks to nodeb alone).
"""

from __future__ import annotations

from pathlib import Path

from ddp_jobs import DdpJob, assert_same_weights, kill_host, last_step_before, record
from test_faults_multihost import TOPOLOGY


def test_a_spare_takes_the_place_of_a_killed_host(hosts, tmp_path: Path, ddp_reference: list[float]) -> None:
    net = hosts(3)
    a, b, c = net.hosts
    job = DdpJob(net, tmp_path, nnodes="1:2", max_restarts=0, extra=TOPOLOGY)
    job.start_all([a, b])
    job.wait_until(lambda: any(p["world"] == 2 for p in job.progress()), "the job on 2 hosts")
    job.start(c)
    job.wait_until(lambda: job.joined(1) == 1, "nodec waiting as a spare (joined round 1)")
    job.wait_step(10)
    # the spare did not disturb the members: one round so far, nodec never started a worker
    assert {(p["round"], p["restart"]) for p in job.progress()} == {(0, 0)}
    assert "nodec" not in {s["host"] for s in job.starts()}
    killed_at = kill_host(net, a)
    before = last_step_before(job, killed_at)
    job.assert_succeeded(job.agents[1:])
    assert_same_weights(job.final_weights(), ddp_reference)
    assert "restarting the job" not in job.outputs()
    first = {s["host"]: s["rank"] for s in job.starts() if s["t"] < killed_at}
    after = {s["host"]: (s["rank"], s["world"]) for s in job.starts() if s["t"] > killed_at}
    assert first == {"nodea": 0, "nodeb": 1}
    assert after == {"nodeb": (1, 2), "nodec": (0, 2)}  # no shrink; nodeb keeps its rank; nodec fills rank 0
    figures = job.figures(killed_at, before, job.agents[1:2])
    assert figures["world_after"] == 2
    record("host killed, hot spare replaces it (2 hosts + 1 spare, max_restarts 0)", figures)
