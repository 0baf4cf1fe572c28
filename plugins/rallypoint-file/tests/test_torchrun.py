"""torch interop: two torchrun agents rendezvous through ``--rdzv-backend rallypoint-file``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    print(f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g} "
          f"group={os.environ['GROUP_RANK']}", flush=True)
    dist.destroy_process_group()
    """
)


def test_rallypoint_import_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import rallypoint.rendezvous, rallypoint.rendezvous.handler, rallypoint_file.backend, rallypoint_file.hooks\n"
        "from rallypoint.core.plugins import get_plugin_manager\n"
        "from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS\n"
        "get_plugin_manager().registry(RENDEZVOUS_BACKENDS)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_torch_registry_has_the_handler() -> None:
    code = (
        "from torch.distributed.elastic.rendezvous.registry import handler_registry as r\n"
        "assert 'rallypoint-file' in r._registry, sorted(r._registry)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
def test_two_torchrun_agents_run_a_job(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "rallypoint-file",
        "--rdzv-endpoint",
        str(tmp_path / "rdzv"),
        "--rdzv-id",
        "X",
        "--monitor-interval",
        "0.1",
        str(script),
    ]
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
    lines = sorted(line for out in outputs for line in out.splitlines() if line.startswith("RESULT"))
    assert lines == ["RESULT rank=0 world=2 sum=3 group=0", "RESULT rank=1 world=2 sum=3 group=1"], outputs
    # The rendezvous state is JSON files, closed at the end (torch's shutdown semantics).
    header = (tmp_path / "rdzv" / "X" / "kv" / "round" / "header").read_text()
    assert '"closed":true' in header.replace(" ", "")
