"""Kubernetes detection: agents started with an Indexed Job's variables on namespace hosts form one job.

No Kubernetes cluster is available here. Each namespace host plays a pod of the Indexed Job
``train`` (host name ``train-<index>``), and the headless service's DNS name of pod 0
(``train-0.train-svc``) resolves to pod 0's address, as cluster DNS would. The agents get the
variables the manifest of the "Running on Kubernetes" page gives, and no rendezvous flag.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import netns
from ddp_jobs import clean_env

PROBE = Path(__file__).parent / "launch_probe.py"
RALLYPOINT = str(Path(sys.executable).parent / "rallypoint")


def test_indexed_job_pods_form_one_job(hosts: Any, tmp_path: Path) -> None:
    net: netns.HostNetwork = hosts(3, names=["train-0", "train-1", "train-2"])
    pod0 = net.hosts[0]
    for host in net.hosts:  # the headless service's record of pod 0
        with open(netns.NETNS_ETC / host.ns / "hosts", "a") as etc:
            etc.write(f"{pod0.addr} train-0.train-svc\n")
    job_file = tmp_path / "job.toml"
    job_file.write_text(f'[job]\nentrypoint = "{PROBE}"\nargs = ["{tmp_path / "out"}"]\n')
    procs = []
    for index, host in enumerate(net.hosts):
        env = clean_env(
            JOB_COMPLETION_INDEX=str(index),
            HOSTNAME=host.name,
            RALLYPOINT_K8S_NNODES="3",
            RALLYPOINT_K8S_SERVICE="train-svc",
        )
        argv = [RALLYPOINT, "run", "--log-dir", str(tmp_path / "logs" / host.name), str(job_file)]
        procs.append(host.popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [p.communicate(timeout=90)[0].decode(errors="replace") for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(outputs)[-4000:]
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("rank*.json"))]
    assert sorted(r["RANK"] for r in records) == ["0", "1", "2"], records
    assert {r["WORLD_SIZE"] for r in records} == {"3"}
    assert {r["TORCHELASTIC_RUN_ID"] for r in records} == {"k8s-train"}
    assert {r["host"] for r in records} == {"train-0", "train-1", "train-2"}
    assert "127.0.0.1" not in {r["MASTER_ADDR"] for r in records}
