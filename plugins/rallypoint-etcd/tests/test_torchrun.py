"""torch interop: two torchrun agents rendezvous through ``--rdzv-backend rallypoint-etcd``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rallypoint.rendezvous.testing import assert_torch_registry_has, run_torchrun_agents
from rallypoint.rendezvous.torchrun_handlers import backend_record
from rallypoint.rendezvous.torchrun_handlers import options_from_params as _options_from_params
from rallypoint_etcd.client import EtcdClient
from rallypoint_etcd.options import EtcdOptions
from rallypoint_etcd.testing import EtcdServer


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
    assert_torch_registry_has("rallypoint-etcd")


class Params(SimpleNamespace):
    """The part of torch's RendezvousParameters the handler reads."""

    def get(self, key: str, default: object = None) -> object:
        return self.config.get(key, default)


def options_from_params(params: Params) -> EtcdOptions:
    record = backend_record("rallypoint_etcd.hooks:rallypoint_rendezvous_backends", "etcd")
    opts = _options_from_params("rallypoint-etcd", record, params, endpoint_hint="HOST:PORT (an etcd client endpoint)")
    assert isinstance(opts, EtcdOptions)
    return opts


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
    conf = ("--rdzv-conf", "namespace=torchrun")
    lines = run_torchrun_agents("rallypoint-etcd", etcd_server.endpoint, tmp_path, *conf, rdzv_id="torchjob")
    assert lines == ["RESULT rank=0 world=2 sum=3 group=0", "RESULT rank=1 world=2 sum=3 group=1"]
    # torch's shutdown closes the rendezvous; the last agent out removed the run's keys
    opts = EtcdOptions(endpoints=[etcd_server.endpoint], namespace="torchrun")
    client = EtcdClient(opts)
    try:
        assert client.get_prefix(opts.base_key("torchjob"))[0] == {}
    finally:
        client.close()
