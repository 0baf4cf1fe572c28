"""``[collectives.options]`` reach a worker: env JSON -> the backend's options model -> its factory -> torch.

The backend here is a test plugin with an options model and a factory that registers a torch
backend of its own (a Gloo group under another name), so the whole path runs for real in one
process: ``RALLYPOINT_COLLECTIVES_OPTIONS`` -> ``init()`` -> the factory -> torch's
``init_process_group(pg_options=...)`` -> the torch backend's creator.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from rallypoint.collectives.env import OPTIONS_ENV, WorkerEnv, parse_options
from rallypoint.collectives.records import BackendContext, CollectiveBackendRecord
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import get_plugin_manager, hookimpl

TORCH_NAME = "rptuned"
#: What the factory and torch's backend creator were handed, in order.
RECEIVED: list[tuple[str, Any]] = []


class TunedOptions(BaseModel):
    """The options of the test backend."""

    model_config = ConfigDict(extra="forbid")

    threads: int = Field(default=2, ge=1)
    label: str = "default"


def _create_torch_backend(opts: Any, backend_options: Any) -> Any:
    import torch.distributed as dist

    RECEIVED.append(("torch", backend_options))
    return dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def tuned_factory(context: BackendContext) -> Any:
    """The test backend's factory: registers the torch backend once, returns its pg_options."""
    import torch.distributed as dist

    if not hasattr(dist.Backend, TORCH_NAME.upper()):
        dist.Backend.register_backend(TORCH_NAME, _create_torch_backend, extended_api=True, devices=["cpu"])
    RECEIVED.append(("factory", context))
    return {"built by": "tuned_factory", "options": context.options}


TUNED = CollectiveBackendRecord(
    name="tuned",
    torch_backend=TORCH_NAME,
    device="cpu",
    stream_ordered=False,
    options_model=TunedOptions,
    factory=f"{__name__}:tuned_factory",
)


class TunedPlugin:
    @hookimpl
    def rallypoint_collective_backends(self) -> list[CollectiveBackendRecord]:
        return [TUNED]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _init(environ: dict[str, str]) -> Any:
    import rallypoint.collectives as rc

    pm = get_plugin_manager(plugins={"tuned": TunedPlugin()})
    return rc.init(
        rank=0, world_size=1, master_addr="127.0.0.1", master_port=_port(), environ=environ, plugin_manager=pm
    )


def test_options_reach_the_factory_and_torch() -> None:
    import torch

    import rallypoint.collectives as rc

    RECEIVED.clear()
    environ = {
        "RALLYPOINT_COLLECTIVES_BACKEND": "tuned",
        "RALLYPOINT_COLLECTIVES_TIMEOUT": "20",
        OPTIONS_ENV: '{"threads": 8, "label": "fast"}',
    }
    info = _init(environ)
    try:
        assert (info.backend, info.torch_backend, info.device) == ("tuned", TORCH_NAME, "cpu")
        (kind, context), (torch_kind, pg_options) = RECEIVED
        assert kind == "factory"
        assert context.options == TunedOptions(threads=8, label="fast")
        assert (context.rank, context.world_size, context.device) == (0, 1, None)
        assert context.timeout == 20 + 10  # a blocking backend's group timeout has the margin
        assert torch_kind == "torch"
        assert pg_options == {"built by": "tuned_factory", "options": TunedOptions(threads=8, label="fast")}
        # the facade times calls on this group as a blocking one (its record says so)
        t = rc.all_reduce(torch.tensor([3.0]))
        assert t.item() == 3.0
        rc.barrier(timeout=5)
    finally:
        rc.destroy()


def test_no_options_give_the_models_defaults() -> None:
    import rallypoint.collectives as rc

    RECEIVED.clear()
    _init({"RALLYPOINT_COLLECTIVES_BACKEND": "tuned", OPTIONS_ENV: "{}"})
    try:
        assert RECEIVED[0][1].options == TunedOptions()
    finally:
        rc.destroy()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("{threads: 8}", "is not valid JSON"),
        ('["threads", 8]', "must be a JSON object"),
        ('{"threads": "many"}', "collectives.options.threads"),
        ('{"threads": 0}', "greater than or equal to 1"),
        ('{"thread": 8}', "collectives.options.thread"),
    ],
)
def test_options_that_do_not_fit_name_the_variable(raw: str, expected: str) -> None:
    import rallypoint.collectives as rc

    RECEIVED.clear()
    with pytest.raises(ConfigError) as info:
        _init({"RALLYPOINT_COLLECTIVES_BACKEND": "tuned", OPTIONS_ENV: raw})
    message = str(info.value)
    assert f"{OPTIONS_ENV} (environment)" in message
    assert expected in message
    assert RECEIVED == []  # refused before the factory or torch saw anything
    assert not rc.is_initialized()


def test_a_backend_without_options_model_refuses_options() -> None:
    import rallypoint.collectives as rc

    with pytest.raises(ConfigError) as info:
        rc.init(
            "gloo",
            rank=0,
            world_size=1,
            master_addr="127.0.0.1",
            master_port=_port(),
            environ={OPTIONS_ENV: '{"threads": 8}'},
        )
    assert "collective backend 'gloo' takes no options; remove threads" in str(info.value)
    assert OPTIONS_ENV in str(info.value)
    assert not rc.is_initialized()


def test_worker_env_reads_the_options() -> None:
    assert WorkerEnv.from_environ({OPTIONS_ENV: '{"a": {"b": [1, 2]}}'}).options == {"a": {"b": [1, 2]}}
    assert WorkerEnv.from_environ({}).options == {}
    assert parse_options("  ") == {}
    assert parse_options(None) == {}
