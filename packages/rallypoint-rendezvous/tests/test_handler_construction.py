"""Building a handler: from a resolved selection (options taken as given), by name, and the timeouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel

from rallypoint.core.config import Selection
from rallypoint.core.errors import PluginError
from rallypoint.rendezvous.config import RendezvousSection
from rallypoint.rendezvous.handler import RendezvousHandler, open_backend
from rallypoint.rendezvous.memory import MemoryBackend, MemoryOptions
from rallypoint.rendezvous.records import RendezvousBackendRecord
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

TIMEOUTS = RendezvousTimeouts(join=7, last_call=0.5, close=3, heartbeat_interval=0.25, heartbeat_timeout=2)


@dataclass(frozen=True, kw_only=True)
class SpyRecord(RendezvousBackendRecord):
    """A rendezvous backend record whose factory records what it is handed."""

    calls: list[tuple[str, Any]]

    def load(self) -> Any:
        def factory(run_id: str, options: Any) -> MemoryBackend:
            self.calls.append((run_id, options))
            return MemoryBackend(run_id, shared=False)

        return factory


def _selection(options: BaseModel | None, calls: list[tuple[str, Any]]) -> Selection:
    record = SpyRecord(name="spy", options_model=MemoryOptions, calls=calls)
    return Selection("rendezvous.backend", "spy", record, None, options)


def test_from_selection_hands_the_validated_options_over_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_second_validation(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the options were validated a second time")

    monkeypatch.setattr(MemoryOptions, "model_validate", no_second_validation)
    options = MemoryOptions(namespace="resolved")
    calls: list[tuple[str, Any]] = []
    handler = RendezvousHandler.from_selection(
        _selection(options, calls), make_node(0), run_id="job-7", min_nodes=1, max_nodes=2, timeouts=TIMEOUTS
    )
    try:
        assert calls == [("job-7", options)]
        assert calls[0][1] is options
        assert handler.run_id == "job-7"
        assert handler.timeouts is TIMEOUTS
        assert (handler.settings.min_nodes, handler.settings.max_nodes) == (1, 2)
        assert handler.next_rendezvous().num_nodes == 1
    finally:
        handler.shutdown()


def test_open_backend_calls_the_factory_with_run_id_and_options() -> None:
    calls: list[tuple[str, Any]] = []
    backend = open_backend(_selection(None, calls), "run-1")
    assert backend.run_id == "run-1"
    assert calls == [("run-1", None)]


def test_open_backend_refuses_a_selection_without_a_rendezvous_record() -> None:
    unresolved = Selection("rendezvous.backend", "etcd", note="rallypoint-etcd not installed")
    with pytest.raises(PluginError, match=r"rendezvous.backend = 'etcd' .*rallypoint-etcd not installed"):
        open_backend(unresolved, "run")


def test_timeouts_from_a_section_keep_its_values() -> None:
    section = RendezvousSection(
        join_timeout="7s", last_call_timeout="500ms", close_timeout=3, heartbeat_interval=0.25, heartbeat_timeout=2
    )
    assert RendezvousTimeouts.from_section(section) == TIMEOUTS


def test_the_section_takes_its_defaults_from_the_timeouts() -> None:
    assert RendezvousTimeouts.from_section(RendezvousSection()) == RendezvousTimeouts()


def test_timeouts_from_loose_options_parse_durations_and_default_the_rest() -> None:
    raw = {"join_timeout": "5m", "last_call_timeout": "250ms", "keep_alive_interval": "1"}
    got = RendezvousTimeouts.from_options(raw.get, where="--rdzv-conf")
    defaults = RendezvousTimeouts()
    assert (got.join, got.last_call, got.heartbeat_interval) == (300.0, 0.25, 1.0)
    assert (got.close, got.heartbeat_timeout) == (defaults.close, defaults.heartbeat_timeout)
    # the job file's name wins over torch's alias
    both = {"heartbeat_interval": "2s", "keep_alive_interval": "1s"}
    assert RendezvousTimeouts.from_options(both.get).heartbeat_interval == 2.0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"join_timeout": "soon"}, r"--rdzv-conf: join_timeout: invalid duration 'soon'"),
        ({"close_timeout": "0"}, r"--rdzv-conf: rendezvous close_timeout must be positive"),
        ({"heartbeat_interval": "20s"}, r"--rdzv-conf: heartbeat_timeout \(10s\) must be longer"),
    ],
)
def test_timeouts_from_loose_options_name_the_bad_key(raw: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RendezvousTimeouts.from_options(raw.get, where="--rdzv-conf")
