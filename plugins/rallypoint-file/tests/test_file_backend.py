"""File-backend specifics: registration, options, on-disk errors, and 64 node processes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from rallypoint.core.plugins import get_plugin_manager
from rallypoint.rendezvous.backend import Entry
from rallypoint.rendezvous.config import RendezvousSection
from rallypoint.rendezvous.errors import RendezvousStateError
from rallypoint.rendezvous.factory import open_backend, select_backend
from rallypoint.rendezvous.handler import RendezvousHandler
from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS
from rallypoint.rendezvous.testing import MultiProcessHandlerConformance, make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts
from rallypoint_file.backend import FileBackend, FileOptions

from .test_file_conformance import FileFactory


def test_registered_through_the_entry_point(tmp_path: Path) -> None:
    pm = get_plugin_manager()
    record = pm.registry(RENDEZVOUS_BACKENDS).get("file")
    assert record.options_model is FileOptions
    assert record.multi_host
    assert pm.registry(RENDEZVOUS_BACKENDS).entry("file").provider.distribution == "rallypoint-file"


def test_select_validates_the_options_once_and_open_backend_takes_them_as_given(tmp_path: Path) -> None:
    selection = select_backend("file", {"path": str(tmp_path), "poll_interval": "0.02"})
    assert isinstance(selection.options, FileOptions)
    assert selection.options.poll_interval == 0.02
    assert selection.provider is not None
    assert selection.provider.distribution == "rallypoint-file"
    backend = open_backend(selection, "job-1")
    assert isinstance(backend, FileBackend)
    assert backend.root == tmp_path / "job-1"
    with pytest.raises(ValidationError, match="bogus"):
        select_backend("file", {"path": str(tmp_path), "bogus": 1})


def test_handler_from_a_config_section(tmp_path: Path) -> None:
    section = RendezvousSection(backend="file", run_id="job-1", join_timeout="90s", options={"path": str(tmp_path)})
    handler = RendezvousHandler.from_config(section, make_node(0), min_nodes=1, max_nodes=1)
    assert isinstance(handler.backend, FileBackend)
    assert handler.run_id == "job-1"
    assert handler.timeouts == RendezvousTimeouts.from_section(section)
    assert handler.timeouts.join == 90.0
    bad = RendezvousSection(backend="file", run_id="job-1", options={"path": str(tmp_path), "bogus": 1})
    with pytest.raises(ValidationError, match="bogus"):
        RendezvousHandler.from_config(bad, make_node(0), min_nodes=1, max_nodes=1)


def test_corrupt_state_file_is_named(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "run")
    backend.set("round/header", {"x": 1})
    path = backend._file("round/header")
    path.write_text("{not json")
    with pytest.raises(RendezvousStateError, match=str(path)) as err:
        backend.get("round/header")
    assert "corrupt" in str(err.value)


def test_foreign_record_is_named(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "run")
    backend.set("k", 1)
    path = backend._file("k")
    path.write_text(json.dumps({"something": "else"}))
    with pytest.raises(RendezvousStateError, match="not a rallypoint-file record"):
        backend.get("k")


def test_foreign_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "data.bin").write_bytes(b"\x00\x01")
    with pytest.raises(RendezvousStateError, match="not a rallypoint rendezvous directory"):
        FileBackend(tmp_path, "run")


def test_foreign_format_file_is_refused(tmp_path: Path) -> None:
    FileBackend(tmp_path, "run")
    (tmp_path / "run" / "FORMAT").write_text('{"format": "other"}')
    with pytest.raises(RendezvousStateError, match="FORMAT"):
        FileBackend(tmp_path, "run")


def test_unreadable_state_file_is_named(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path, "run")
    path = backend._file("k")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir()  # something that cannot be read as a file (as root, chmod 000 would still read)
    with pytest.raises(RendezvousStateError, match="cannot read rendezvous state file") as err:
        backend.get("k")
    assert str(path) in str(err.value)


def test_ttl_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="clocks"):
        FileBackend(tmp_path, "run").set("k", 1, ttl=1)


def test_state_is_json_per_node(tmp_path: Path) -> None:
    """Per-node records plus a small header; every file is JSON (nothing pickled)."""
    h = MultiProcessHandlerConformance()
    h._processes_rendezvous(FileFactory(tmp_path), "perrun", 3)
    # every file of the state, change tokens included; *.tmp are writes in flight (or left by a
    # process killed mid-write) and never read as state
    files = [p for p in (tmp_path / "perrun" / "kv").rglob("*") if p.is_file() and p.suffix != ".tmp"]
    names = {str(p.relative_to(tmp_path / "perrun" / "kv")) for p in files}
    assert {"join/0%2Fnode0", "join/0%2Fnode1", "join/0%2Fnode2", "round/header"} <= names
    for p in files:
        json.loads(p.read_text())
    header = json.loads((tmp_path / "perrun" / "kv" / "round" / "header").read_text())
    assert len(json.dumps(header)) < 400


def test_64_processes_rendezvous(tmp_path: Path) -> None:
    h = MultiProcessHandlerConformance()
    # Heartbeat timeouts sized for 64 processes sharing two CPUs.
    timeouts = RendezvousTimeouts(join=60, last_call=1, close=5, heartbeat_interval=1, heartbeat_timeout=10)
    elapsed = h._processes_rendezvous(
        FileFactory(tmp_path), f"big-{uuid.uuid4().hex[:6]}", 64, timeout=120, timeouts=timeouts
    )
    assert elapsed < 60


def test_16_processes_rendezvous_well_within_a_heartbeat_interval(tmp_path: Path) -> None:
    """Waiters are woken by the change they wait for, not by a heartbeat-interval deadline.

    With a 30 s heartbeat interval, a lost wake-up (a node sleeping until its next periodic
    check) would take at least 30 s; a watch-driven rendezvous of 16 processes takes
    milliseconds. The bound, half an interval, leaves room for forking 16 processes on a
    loaded machine and still tells the two apart.
    """
    h = MultiProcessHandlerConformance()
    interval = 30.0
    timeouts = RendezvousTimeouts(
        join=4 * interval, last_call=interval, close=5, heartbeat_interval=interval, heartbeat_timeout=2 * interval
    )
    elapsed = h._processes_rendezvous(
        FileFactory(tmp_path), f"fast-{uuid.uuid4().hex[:6]}", 16, timeout=4 * interval, timeouts=timeouts
    )
    assert elapsed < interval / 2, f"16 processes took {elapsed:.2f} s to rendezvous (heartbeat interval {interval:g}s)"


def test_prefix_watch_ignores_writes_to_other_directories(tmp_path: Path) -> None:
    """A prefix watch polls its own directory's change token: heartbeats do not wake it."""
    backend = FileBackend(tmp_path, "run", poll_interval=0.001)
    backend.set("round/header", 1)
    snapshot = {k: e.version for k, e in backend.list("round/").items()}
    calls = []
    real_list = backend.list

    def counting_list(prefix: str) -> dict[str, Entry]:
        calls.append(prefix)
        return real_list(prefix)

    backend.list = counting_list  # type: ignore[method-assign]
    other = FileBackend(tmp_path, "run")
    for i in range(20):
        other.set(f"hb/node{i}", i)
    assert not backend.watch_prefix("round/", versions=snapshot, timeout=0.2)
    assert len(calls) == 1, calls  # the first look only: no relisting for writes under hb/
    other.add("round/count/0", 1)
    assert backend.watch_prefix("round/", versions=snapshot, timeout=5)
