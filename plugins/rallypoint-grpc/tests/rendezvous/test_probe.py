"""A new backend probes its server: a refused token fails at once, a missing server does not."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint_grpc.rendezvous.backend import create_grpc_backend

from .conftest import ServerProcess
from .test_agent_hosted import free_port
from .test_hosting import python

TOKEN = "probe-token-value"


def test_a_refused_token_fails_when_the_backend_is_made(start_server: type[ServerProcess], tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server = start_server("--token-file", str(token_file))
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token\n")
    options = {"endpoint": server.address, "serve": "never", "token_file": str(wrong)}
    with pytest.raises(RendezvousBackendError, match=rf"{server.address}.*refused the call: .*token_file"):
        create_grpc_backend("probe", options)
    good = create_grpc_backend("probe", {**options, "token_file": str(token_file)})
    assert good.get("anything") is None
    assert good.probe() is True


def test_a_server_not_up_yet_is_waited_for_a_second_at_most_and_is_no_error() -> None:
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    backend = create_grpc_backend("probe", {"endpoint": endpoint, "serve": "never", "retry_timeout": 5})
    took = time.monotonic() - started
    assert took < 3.0, f"making the backend took {took:.2f} s"
    assert backend.probe(wait=0.2) is False


def test_the_probe_is_answered_before_the_factory_returns() -> None:
    # Agent-hosted: the in-process server counts the calls it answered; the probe's are made
    # before any call of the caller's own.
    python(
        f"""
        from rallypoint_grpc.rendezvous.backend import create_grpc_backend, _HOSTED
        endpoint = "127.0.0.1:{free_port()}"
        b = create_grpc_backend("run1", {{"endpoint": endpoint, "linger": 0}})
        assert _HOSTED[endpoint].service.calls >= 2, _HOSTED[endpoint].service.calls  # the read and the watch
        assert b.get("probe") is None  # nothing written
        """
    )
