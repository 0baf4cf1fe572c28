"""torch interop: two torchrun agents rendezvous through ``--rdzv-backend rallypoint-grpc``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import ServerProcess
from .test_agent_hosted import free_port

SCRIPT = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    print(f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g}", flush=True)
    dist.destroy_process_group()
    """
)


def test_torch_registry_has_the_handler() -> None:
    code = (
        "from torch.distributed.elastic.rendezvous.registry import handler_registry as r\n"
        "assert 'rallypoint-grpc' in r._registry, sorted(r._registry)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _two_torchruns(tmp_path: Path, endpoint: str, *conf: str) -> list[str]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--nnodes", "2",
        "--nproc-per-node", "1",
        "--rdzv-backend", "rallypoint-grpc",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", "T",
        *conf,
        "--monitor-interval", "0.1",
        str(script),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
        for _ in range(2)
    ]
    outputs = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=120)
            outputs.append(out)
            assert agent.returncode == 0, out
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    return sorted(line for out in outputs for line in out.splitlines() if line.startswith("RESULT"))


@pytest.mark.slow
def test_two_torchrun_agents_on_an_agent_hosted_server(tmp_path: Path) -> None:
    lines = _two_torchruns(tmp_path, f"127.0.0.1:{free_port()}")
    assert lines == ["RESULT rank=0 world=2 sum=3", "RESULT rank=1 world=2 sum=3"]


@pytest.mark.slow
def test_two_torchrun_agents_on_a_standalone_server(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    server = start_server()
    lines = _two_torchruns(tmp_path, server.address, "--rdzv-conf", "serve=never")
    assert lines == ["RESULT rank=0 world=2 sum=3", "RESULT rank=1 world=2 sum=3"]
    assert server.alive()
