"""Hot spares: with ``nodes.max`` reached, an extra host waits; it replaces a host that dies.

The job runs on nodea and nodeb (``--nnodes 1:2``, the ``topology`` rank strategy); nodec
arrives after the round completed and waits as a spare (the members are not disturbed). When
the host of global rank 0 (which serves the workers' store) is killed, the next round has the
survivor and nodec: the world size stays 2, the survivor keeps its rank 1, and nodec takes
rank 0, the dead host's place. The time from the kill to the first step of the new round is
recorded next to the same fault without a spare (``test_faults_multihost.py``: the job
shrinks to the survivor alone).
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
    running = job.progress()[-1]["round"]  # 0, or 1 when one host came after round 0 completed
    job.start(c)
    job.wait_until(lambda: job.joined(running + 1) == 1, f"nodec waiting as a spare (joined round {running + 1})")
    job.wait_step(10)
    # the spare did not disturb the members: the round went on, nodec never started a worker
    assert job.progress()[-1]["round"] == running
    assert "nodec" not in {s["host"] for s in job.starts()}
    # the host of global rank 0 (it serves the workers' store) dies; which one it is depends on arrival
    first = {s["host"]: s["rank"] for s in job.starts() if s["round"] == running}
    assert sorted(first.values()) == [0, 1]
    victim, survivor = (a, b) if first["nodea"] == 0 else (b, a)
    killed_at = kill_host(net, victim)
    before = last_step_before(job, killed_at)
    alive = [agent for agent in job.agents if agent.host is not victim]
    job.assert_succeeded(alive)
    assert_same_weights(job.final_weights(), ddp_reference)
    assert "restarting the job" not in job.outputs()
    after = {s["host"]: (s["rank"], s["world"]) for s in job.starts() if s["t"] > killed_at}
    # no shrink; the survivor keeps its rank 1; the spare fills the dead host's rank 0
    assert after == {survivor.name: (1, 2), "nodec": (0, 2)}
    figures = job.figures(killed_at, before, [a for a in alive if a.host is survivor])
    assert figures["world_after"] == 2
    record("host killed, hot spare replaces it (2 hosts + 1 spare, max_restarts 0)", figures)
