"""torchrun interop across hosts: two torchrun agents on two namespace hosts, ``--rdzv-backend rallypoint-file``.

torch's own agent (``python -m torch.distributed.run``) uses rallypoint's file rendezvous in a
directory both hosts see, and runs the same DDP job as ``rallypoint run``: its final weights
equal the single-process run's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ddp_jobs import PY, TRAIN, TRAIN_ARGS, assert_same_weights, clean_env


def test_two_torchrun_agents_on_two_hosts_share_the_rallypoint_file_rendezvous(
    hosts, tmp_path: Path, ddp_reference: list[float]
) -> None:
    net = hosts(2)
    out = tmp_path / "out"
    procs = []
    for host in net.hosts:
        argv = [
            PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "rallypoint-file", "--rdzv-endpoint", str(tmp_path / "rdzv"), "--rdzv-id", "torchrun-mh",
            "--max-restarts", "0", "--local-addr", host.addr, "--monitor-interval", "0.1",
            str(TRAIN), "--out", str(out), *TRAIN_ARGS,
        ]  # fmt: skip
        procs.append(
            # each host's name resolves to 127.0.0.1 there (as on many cloud images); torchrun does not
            # derive Gloo's interface from --local-addr as `rallypoint run` does, so it is named here
            host.popen(
                argv,
                cwd=tmp_path,
                env=clean_env(GLOO_SOCKET_IFNAME="eth0"),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        outputs.append(output[-4000:])
    assert [p.returncode for p in procs] == [0, 0], "\n---\n".join(outputs)
    assert_same_weights(json.loads((out / "final.json").read_text()), ddp_reference)
    starts = [json.loads(line) for line in (out / "starts.jsonl").read_text().splitlines()]
    assert sorted(s["rank"] for s in starts) == [0, 1]
    assert {s["host"] for s in starts} == {"nodea", "nodeb"}
