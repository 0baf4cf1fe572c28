"""torch interop: two torchrun agents rendezvous through ``--rdzv-backend rallypoint-etcd``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from rallypoint_etcd.client import EtcdClient
from rallypoint_etcd.options import EtcdOptions
from rallypoint_etcd.testing import EtcdServer
from rallypoint_etcd.torch_handler import options_from_params

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


def test_importing_the_plugin_loads_neither_etcd_nor_grpc_nor_torch() -> None:
    code = (
        "import sys\n"
        "import rallypoint_etcd.hooks, rallypoint_etcd.options, rallypoint_etcd.torch_handler\n"
        "from rallypoint.core.plugins import get_plugin_manager\n"
        "from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS\n"
        "reg = get_plugin_manager().registry(RENDEZVOUS_BACKENDS)\n"
        "assert 'etcd' in reg.names(), reg.names()\n"
        "heavy = sorted(m for m in ('torch', 'grpc', 'etcd3', 'pyetcd') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=180)


def test_torch_registry_has_the_handler() -> None:
    code = (
        "from torch.distributed.elastic.rendezvous.registry import handler_registry as r\n"
        "assert 'rallypoint-etcd' in r._registry, sorted(r._registry)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=180)


class Params(SimpleNamespace):
    """The part of torch's RendezvousParameters the handler reads."""

    def get(self, key: str, default: object = None) -> object:
        return self.config.get(key, default)


def test_rdzv_endpoint_and_conf_become_options() -> None:
    opts = options_from_params(Params(endpoint="10.0.0.1:2379,10.0.0.2", config={"namespace": "team", "key_ttl": "30"}))
    assert opts.endpoints == ["10.0.0.1:2379", "10.0.0.2"]
    assert (opts.namespace, opts.key_ttl) == ("team", 30)
    with pytest.raises(ValueError, match="needs --rdzv-endpoint"):
        options_from_params(Params(endpoint="", config={}))
    with pytest.raises(ValueError, match="key_ttl"):
        options_from_params(Params(endpoint="h:1", config={"key_ttl": "1"}))


@pytest.mark.slow
def test_two_torchrun_agents_run_a_job(etcd_server: EtcdServer, tmp_path: Path) -> None:
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
        "rallypoint-etcd",
        "--rdzv-endpoint",
        etcd_server.endpoint,
        "--rdzv-id",
        "torchjob",
        "--rdzv-conf",
        "namespace=torchrun",
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
            out, _ = agent.communicate(timeout=240)
            outputs.append(out)
            assert agent.returncode == 0, out
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    lines = sorted(line for out in outputs for line in out.splitlines() if line.startswith("RESULT"))
    assert lines == ["RESULT rank=0 world=2 sum=3 group=0", "RESULT rank=1 world=2 sum=3 group=1"], outputs
    # torch's shutdown closes the rendezvous; the last agent out removed the run's keys
    opts = EtcdOptions(endpoints=[etcd_server.endpoint], namespace="torchrun")
    client = EtcdClient(opts)
    try:
        assert client.get_prefix(opts.base_key("torchjob"))[0] == {}
    finally:
        client.close()
