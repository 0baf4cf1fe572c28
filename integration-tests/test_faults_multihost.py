"""Faults of whole hosts during a real DDP training on namespace hosts, with their figures.

Every test runs ``examples/ddp/train.py`` (one worker per host, to keep the suite's CPU time
small), injects one fault, checks that the job ends as it should with the same final weights
as one plain process, and records detection time, recovery time and steps lost in
``results.json`` (see ``ddp_jobs.py``). Rendezvous heartbeats are short (0.4 s, dead after 2 s).
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

from ddp_jobs import DETECTED, DISTURBED, TRAIN_ARGS, DdpJob, assert_same_weights, kill_host, last_step_before, record

#: The topology strategy, stable ranks (a survivor keeps its ranks where it can).
TOPOLOGY = ("--set", "ranks.strategy=topology")
#: gRPC calls give up after about 2 s (not 15), so a cut-off host notices within its heartbeat timeout.
GRPC_QUICK = ("--set", "rendezvous.options.call_timeout=1", "--set", "rendezvous.options.retry_timeout=1")
#: Slower steps, for faults whose recovery starts a new agent (the job must still be running then).
SLOW_STEPS = (*TRAIN_ARGS, "--step-time", "0.4")
#: The line of an agent that lost the rendezvous (and rejoins), and the one when it rejoined.
LOST = re.compile(r"lost the rendezvous for")
REJOINED = re.compile(r"rejoined the job in round")


def test_a_killed_host_leaves_the_job_on_the_survivors_without_spending_restarts(
    hosts, tmp_path: Path, ddp_reference: list[float]
) -> None:
    net = hosts(2)
    job = DdpJob(net, tmp_path, nnodes="1:2", max_restarts=0, extra=TOPOLOGY)
    job.start_all()
    job.wait_until(lambda: any(p["world"] == 2 and p["step"] >= 8 for p in job.progress()), "step 8 on 2 hosts")
    rank0 = next(s["host"] for s in reversed(job.starts()) if s["rank"] == 0)
    victim = next(h for h in net.hosts if h.name == rank0)
    # every process of the host of global rank 0 at once: its agent, its worker (which serves the store)
    killed_at = kill_host(net, victim)
    before = last_step_before(job, killed_at)
    survivor = next(agent for agent in job.agents if agent.host is not victim)
    job.assert_succeeded([survivor])
    assert_same_weights(job.final_weights(), ddp_reference)
    out = survivor.output()
    # its worker failed (the peer vanished), yet no restart was counted: max_restarts = 0 held
    assert "restarting the job" not in out
    assert "no restart counted" in out
    after = [s for s in job.starts() if s["t"] > killed_at]
    assert [(s["host"], s["world"], s["rank"], s["restart"]) for s in after] == [(survivor.host.name, 1, 0, 0)]
    figures = job.figures(killed_at, before, [survivor])
    assert figures["world_after"] == 1
    record("host killed, no spare (2 hosts -> 1, max_restarts 0)", figures)


def test_a_late_host_joins_and_the_job_grows(hosts, tmp_path: Path, ddp_reference: list[float]) -> None:
    net = hosts(3)
    job = DdpJob(net, tmp_path, nnodes="2:3", max_restarts=0, train=SLOW_STEPS)
    job.start_all(net.hosts[:2])
    before = job.wait_step(8)
    assert before["world"] == 2
    joined_at = time.time()
    late = job.start(net.hosts[2])
    job.assert_succeeded()
    assert_same_weights(job.final_weights(), ddp_reference)
    grown = [p for p in job.progress() if p["world"] == 3]
    assert grown, f"the job never ran on 3 hosts:\n{job.outputs()}"
    assert "restarting the job" not in job.outputs()
    figures = job.figures(joined_at, last_step_before(job, joined_at), job.agents[:2])
    # the late agent's own start (imports, rendezvous) is part of the time to its first step
    figures["late_agent_first_line_s"] = round(late.lines[0][0] - joined_at, 2) if late.lines else None
    record("late host joins (2 hosts -> 3)", figures)


def test_a_short_link_outage_does_not_stop_the_job(hosts, tmp_path: Path, ddp_reference: list[float]) -> None:
    net = hosts(2)
    a, b = net.hosts
    grpc = ("grpc", f"{a.addr}:29561")  # the agent on nodea serves the rendezvous: nodeb reaches it by network
    extra = (*GRPC_QUICK, "--set", "rendezvous.heartbeat_timeout=4s")
    job = DdpJob(net, tmp_path, nnodes="1:2", backend=grpc, max_restarts=0, extra=extra)
    job.start_all()
    job.wait_until(lambda: any(p["world"] == 2 and p["step"] >= 8 for p in job.progress()), "step 8 on 2 hosts")
    cut_at = time.time()
    net.partition(b)
    job.wait_until(lambda: time.time() - cut_at >= 1.0, "1 s of outage")
    net.heal(b)
    healed_at = time.time()
    job.assert_succeeded()
    assert_same_weights(job.final_weights(), ddp_reference)
    progress = job.progress()
    before = last_step_before(job, cut_at)
    key = {(p["round"], p["restart"], p["world"]) for p in progress if p["t"] >= before["t"]}
    assert key == {(before["round"], before["restart"], 2)}, job.outputs()  # the same round went on
    assert not any(a.first_line(DISTURBED, cut_at) for a in job.agents), job.outputs()
    noticed = [t for a in job.agents if (t := a.first_line(DETECTED, cut_at)) is not None]  # a heartbeat retried
    gaps = [q["t"] - p["t"] for p, q in itertools.pairwise(progress) if q["t"] >= cut_at]
    record(
        "link down 1 s < heartbeat_timeout 4 s (continues)",
        {
            "outage_s": round(healed_at - cut_at, 2),
            "detection_s": round(min(noticed) - cut_at, 2) if noticed else None,
            "longest_step_gap_s": round(max(gaps), 2),
            "recovery_s": 0,
            "steps_lost": 0,
        },
    )


def test_a_long_link_outage_drops_the_host_which_rejoins(hosts, tmp_path: Path, ddp_reference: list[float]) -> None:
    net = hosts(2)
    a, b = net.hosts
    grpc = ("grpc", f"{a.addr}:29562")
    extra = (*TOPOLOGY, *GRPC_QUICK)
    job = DdpJob(net, tmp_path, nnodes="1:2", backend=grpc, max_restarts=0, extra=extra, train=SLOW_STEPS)
    job.start_all()
    job.wait_until(lambda: any(p["world"] == 2 and p["step"] >= 6 for p in job.progress()), "step 6 on 2 hosts")
    cut_at = time.time()
    net.partition(b)
    before = last_step_before(job, cut_at)
    # nodea drops nodeb after heartbeat_timeout and trains alone; nodeb's agent notices it lost the
    # rendezvous, stops its workers and keeps trying to rejoin (no supervisor restarts it)
    job.wait_until(lambda: any(p["t"] > cut_at and p["world"] == 1 for p in job.progress()), "the job on nodea alone")
    job.wait_until(lambda: job.agents[1].first_line(LOST, cut_at) is not None, "nodeb noticed it lost the rendezvous")
    dropped = job.figures(cut_at, before, job.agents[:1])
    assert job.agents[1].proc.poll() is None, f"nodeb's agent ended instead of rejoining:\n{job.outputs()}"
    net.heal(b)
    healed_at = time.time()
    job.assert_succeeded()  # both agents, the one that was dropped included
    assert_same_weights(job.final_weights(), ddp_reference)
    regrown = [p for p in job.progress() if p["t"] > healed_at and p["world"] == 2]
    assert regrown, f"the job did not grow back to 2 hosts:\n{job.outputs()}"
    out = job.agents[1].output()
    assert "its heartbeat could not reach the rendezvous ('grpc' backend at" in out, out
    assert "rejoining, no restart counted" in out, out
    assert "restarting the job" not in job.outputs()
    rejoined = job.agents[1].first_line(REJOINED, healed_at)
    assert rejoined is not None, out
    record(
        "link down > heartbeat_timeout (dropped, rejoins)",
        {
            **dropped,
            "heal_to_rejoin_s": round(rejoined - healed_at, 2),
            "rejoin_to_first_step_s": round(regrown[0]["t"] - healed_at, 2),
        },
    )
