"""torch interop: two torchrun agents rendezvous through ``--rdzv-backend rallypoint-grpc``."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.rendezvous.testing import assert_torch_registry_has, run_torchrun_agents

from .conftest import ServerProcess
from .test_agent_hosted import free_port


def test_torch_registry_has_the_handler() -> None:
    assert_torch_registry_has("rallypoint-grpc")


PAIR = ["RESULT rank=0 world=2 sum=3 group=0", "RESULT rank=1 world=2 sum=3 group=1"]


@pytest.mark.slow
def test_two_torchrun_agents_on_an_agent_hosted_server(tmp_path: Path) -> None:
    assert run_torchrun_agents("rallypoint-grpc", f"127.0.0.1:{free_port()}", tmp_path, rdzv_id="T") == PAIR


@pytest.mark.slow
def test_two_torchrun_agents_on_a_standalone_server(tmp_path: Path, start_server: type[ServerProcess]) -> None:
    server = start_server()
    lines = run_torchrun_agents("rallypoint-grpc", server.address, tmp_path, "--rdzv-conf", "serve=never", rdzv_id="T")
    assert lines == PAIR
    assert server.alive()
