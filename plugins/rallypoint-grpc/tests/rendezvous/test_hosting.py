"""Agent-hosted mode: who serves, on which address; and no grpc import at start-up."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from .conftest import ServerProcess
from .test_agent_hosted import free_port

RALLYPOINT = str(Path(sys.executable).with_name("rallypoint"))


def python(code: str, timeout: float = 60) -> str:
    """Run ``code`` in a fresh interpreter (hosted servers stay out of the test process); its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_cli_and_the_plugin_hooks_do_not_import_grpc() -> None:
    done = subprocess.run([RALLYPOINT, "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip()
    python(
        """
        import sys
        from rallypoint.core.plugins import get_plugin_manager
        from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS
        import rallypoint.agent.run_cli, rallypoint_grpc.hooks
        import rallypoint_grpc.rendezvous.options, rallypoint_grpc.rendezvous.torch_handler, rallypoint_grpc.rpc.options
        assert "grpc" in get_plugin_manager().registry(RENDEZVOUS_BACKENDS).names()
        assert "grpc" not in sys.modules and "torch" not in sys.modules, "grpc or torch imported"
        """
    )


def test_the_agent_that_owns_the_address_serves_on_that_interface_only() -> None:
    port = free_port()
    python(
        f"""
        import socket
        from rallypoint_grpc.rendezvous.backend import create_grpc_backend, _HOSTED
        b = create_grpc_backend("run1", {{"endpoint": "127.0.0.2:{port}", "linger": 0}})
        assert b.add("n", 2) == 2
        assert "127.0.0.2:{port}" in _HOSTED
        s = socket.socket()
        assert s.connect_ex(("127.0.0.1", {port})) != 0, "the server listens beyond the endpoint's address"
        """
    )


def test_an_endpoint_served_elsewhere_is_only_connected_to(start_server: type[ServerProcess]) -> None:
    server = start_server()
    python(
        f"""
        from rallypoint_grpc.rendezvous.backend import create_grpc_backend, _HOSTED
        b = create_grpc_backend("run1", {{"endpoint": "{server.address}"}})  # port taken: connect
        b.set("k", 1)
        assert not _HOSTED
        """
    )
    assert server.alive()


def test_an_address_of_another_host_is_not_served() -> None:
    python(
        """
        from rallypoint_grpc.rendezvous.backend import host_server
        from rallypoint_grpc.rendezvous.options import GrpcOptions
        assert host_server(GrpcOptions(endpoint="192.0.2.1:29400"), None) is None  # TEST-NET-1: not ours
        """
    )


def test_rdzv_serve_prints_the_chosen_port_and_stops_on_sigterm(start_server: type[ServerProcess]) -> None:
    server = start_server()
    assert server.port > 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=10):
        pass
    server.proc.terminate()
    assert server.proc.wait(30) == 0
