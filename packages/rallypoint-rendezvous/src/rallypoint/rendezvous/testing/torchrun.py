"""torch interop: real torchrun agents meeting through a backend's torch rendezvous handler."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["TORCHRUN_JOB", "assert_torch_registry_has", "run_torchrun_agents"]

#: The job :func:`run_torchrun_agents` runs: each worker all-reduces ``rank + 1`` over gloo and prints
#: one ``RESULT rank=R world=W sum=S group=G`` line.
TORCHRUN_JOB = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
print(f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g} "
      f"group={os.environ['GROUP_RANK']}", flush=True)
dist.destroy_process_group()
"""


def assert_torch_registry_has(torch_name: str, timeout: float = 180.0) -> None:
    """Check, in a fresh interpreter, that importing torch's rendezvous registry lists ``torch_name``.

    The fresh interpreter matters: the handler must be registered by the installed entry point
    (``torch.distributed.elastic`` loads them), not by something the test process imported.
    """
    import subprocess

    code = (
        "from torch.distributed.elastic.rendezvous.registry import handler_registry as r\n"
        f"assert {torch_name!r} in r._registry, sorted(r._registry)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=timeout)


def run_torchrun_agents(
    torch_name: str,
    endpoint: str,
    workdir: Path,
    *conf: str,
    rdzv_id: str = "interop",
    nnodes: int = 2,
    timeout: float = 240.0,
) -> list[str]:
    """Run ``nnodes`` torchrun agents (one worker each) through ``--rdzv-backend torch_name``.

    Every agent must exit 0 (the assertion carries all agents' output). Returns the workers'
    ``RESULT`` lines, sorted; for two nodes they are
    ``["RESULT rank=0 world=2 sum=3 group=0", "RESULT rank=1 world=2 sum=3 group=1"]``.

    Args:
        torch_name: the name torch knows the handler by (``rallypoint-file``).
        endpoint: ``--rdzv-endpoint``.
        workdir: where the job script is written and the agents run.
        conf: extra torchrun arguments (``"--rdzv-conf", "key=value"``).
        rdzv_id: ``--rdzv-id``.
        nnodes: how many agents.
        timeout: seconds each agent may take.
    """
    import os
    import subprocess

    script = workdir / "torchrun_job.py"
    script.write_text(TORCHRUN_JOB)
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun), "--nnodes", str(nnodes), "--nproc-per-node", "1",
        "--rdzv-backend", torch_name, "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id,
        *conf, "--monitor-interval", "0.1", str(script),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir)
        for _ in range(nnodes)
    ]
    outputs: list[str] = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=timeout)
            outputs.append(out)
        codes = [a.returncode for a in agents]
        assert codes == [0] * nnodes, f"torchrun agents exited {codes}:\n" + "\n----\n".join(outputs)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    return sorted(line for out in outputs for line in out.splitlines() if line.startswith("RESULT"))
