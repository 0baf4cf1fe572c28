"""The one torchrun-handler factory: torchrun's flags become a backend's validated options."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.records import RendezvousBackendRecord
from rallypoint.rendezvous.torchrun_handlers import backend_record, options_from_params, torchrun_creator

HOOK = f"{__name__}:backends"


class SpaceOptions(BaseModel):
    """A backend whose endpoint is the memory space's namespace."""

    model_config = ConfigDict(extra="forbid")

    space: str
    poll: float = 1.0


def _open(run_id: str, options: SpaceOptions) -> MemoryBackend:
    return MemoryBackend(run_id, namespace=options.space)


def backends() -> list[RendezvousBackendRecord]:
    return [
        RendezvousBackendRecord(
            name="space",
            summary="test",
            factory=f"{__name__}:_open",
            options_model=SpaceOptions,
            endpoint_option="space",
        )
    ]


class Params(SimpleNamespace):
    """The two things the factory reads of torch's RendezvousParameters."""

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)


def test_endpoint_and_conf_become_the_models_options() -> None:
    record = backend_record(HOOK, "space")
    opts = options_from_params(
        "tr-space", record, Params(endpoint="blue", config={"poll": "0.5", "other": "x"}), endpoint_hint="NAME"
    )
    assert opts == SpaceOptions(space="blue", poll=0.5)  # keys of no field (timeouts) are the adapter's


def test_bad_flags_are_named() -> None:
    record = backend_record(HOOK, "space")
    with pytest.raises(ValueError, match=r"^tr-space needs --rdzv-endpoint NAME \(a space\)$"):
        options_from_params("tr-space", record, Params(endpoint="", config={}), endpoint_hint="NAME (a space)")
    with pytest.raises(ValueError, match=r"tr-space: invalid --rdzv-endpoint/--rdzv-conf: poll: .*number"):
        options_from_params("tr-space", record, Params(endpoint="b", config={"poll": "often"}), endpoint_hint="N")
    with pytest.raises(ValueError, match=r"registers no rendezvous backend 'nope'.*'space'"):
        backend_record(HOOK, "nope")


def test_building_the_creator_imports_nothing() -> None:
    sys.modules.pop("rallypoint.rendezvous.torch_compat", None)
    create = torchrun_creator("tr-space", hook=HOOK, backend="space", endpoint_hint="NAME")
    assert callable(create)
    assert "rallypoint.rendezvous.torch_compat" not in sys.modules


def test_the_creator_gives_torch_a_handler_on_the_backend() -> None:
    create = torchrun_creator("tr-space", hook=HOOK, backend="space", endpoint_hint="NAME")
    params = Params(
        endpoint="green", config={"join_timeout": "5"}, run_id="job", min_nodes=1, max_nodes=1, local_addr=None
    )
    handler = create(params)
    assert (handler.get_backend(), handler.get_run_id()) == ("tr-space", "job")
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    handler.shutdown()
