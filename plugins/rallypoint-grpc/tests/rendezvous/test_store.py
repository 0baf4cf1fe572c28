"""The server's state on its own: retried writes, leases, limits, the persistence log."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from rallypoint_grpc.rendezvous.limits import Limits, StoreError
from rallypoint_grpc.rendezvous.options import GrpcOptions
from rallypoint_grpc.rendezvous.store import Store
from rallypoint_grpc.rendezvous.store_log import LOG_NAME


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_retried_write_is_applied_once() -> None:
    store = Store()
    assert store.add("run", "n", 5, request_id="req-1") == 5
    assert store.add("run", "n", 5, request_id="req-1") == 5  # the retry of a lost reply
    assert store.add("run", "n", 5, request_id="req-2") == 10
    first = store.set("run", "k", '"a"', None, request_id="req-3")
    assert store.set("run", "k", '"a"', None, request_id="req-3") == first


def test_leases_expire_on_the_server_clock() -> None:
    clock = FakeClock()
    store = Store(clock=clock)
    store.set("run", "lease", "1", ttl=2.0)
    clock.now += 1.9
    assert store.get("run", "lease") is not None
    clock.now += 0.2
    assert store.get("run", "lease") is None


def test_limits_are_enforced() -> None:
    store = Store(Limits(max_value_bytes=10, max_total_bytes=20, max_watches=1))
    with pytest.raises(StoreError, match="limit is 10"):
        store.set("run", "k", '"' + "x" * 20 + '"', None)
    store.set("run", "a", "1234567", None)
    store.set("run", "b", "1234567", None)
    with pytest.raises(StoreError, match="limit is 20") as exc:
        store.set("run", "c", "12345678", None)
    assert exc.value.code == "exhausted"
    for bad in ("{", "NaN-ish", "[" * 10_000):
        with pytest.raises(StoreError, match="not JSON"):
            Store().set("run", "k", bad, None)
    with pytest.raises(StoreError, match="invalid rendezvous key"):
        store.get("run", "../x")
    with pytest.raises(StoreError, match="invalid run id"):
        store.get("a/b", "x")


def test_the_log_is_replayed_and_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    store = Store(data_dir=tmp_path)
    store.set("run", "a", "1", None)
    store.add("run", "n", 3)
    store.delete("run", "a", None)
    store.close()
    with (tmp_path / LOG_NAME).open("a") as f:
        f.write('{"op": "put", "s": "run", "k": "torn"')  # the server died mid-line
    again = Store(data_dir=tmp_path)
    assert again.get("run", "a") is None
    assert again.get("run", "n") == ("3", 2)
    assert again.get("run", "torn") is None
    assert again.set("run", "a", "2", None) == 4  # versions go on from the log, never reused
    lines = [json.loads(x) for x in (tmp_path / LOG_NAME).read_text().splitlines()]
    assert all(rec["op"] in ("rev", "put", "del") for rec in lines)


def test_a_join_is_one_line_of_the_log_so_a_crash_keeps_its_record_and_count_together(tmp_path: Path) -> None:
    """A server killed between the join record's line and its counter's line kept a record without its count."""
    store = Store(data_dir=tmp_path)
    store.create_and_add("run", "join/1/a", '{"n": "a"}', "count/1", 1)
    log = store._log.file if store._log is not None else None
    assert log is not None
    real_write, calls = log.write, []

    def dies_after_one_write(text: str) -> int:  # the process is killed right after its first write
        calls.append(text)
        if len(calls) > 1:
            raise SystemExit("killed")
        return real_write(text)

    log.write = dies_after_one_write  # type: ignore[method-assign]
    with contextlib.suppress(SystemExit):  # killed somewhere in these two requests
        store.create_and_add("run", "join/1/b", '{"n": "b"}', "count/1", 1)
        store.set("run", "after", "1", None)  # the next write: the process is gone by now
    assert len(calls) == 2  # the second write is where it died
    log.flush()
    again = Store(data_dir=tmp_path)
    assert again.get("run", "join/1/b") is not None
    assert again.get("run", "count/1") == ("2", 4)  # the record and its count, together
    assert again.get("run", "after") is None


def test_a_join_over_the_size_limit_leaves_nothing_after_a_replay(tmp_path: Path) -> None:
    store = Store(data_dir=tmp_path, limits=Limits(max_total_bytes=21))  # "count/1" + "9": 8 bytes
    store.set("run", "count/1", "9", None)
    with pytest.raises(StoreError, match="the limit is 21"):  # the record fits (21 bytes), its count ("10") not
        store.create_and_add("run", "j", '"' + "x" * 10 + '"', "count/1", 1)
    assert store.get("run", "j") is None
    store.close()
    again = Store(data_dir=tmp_path)
    assert again.get("run", "j") is None
    assert again.get("run", "count/1") == ("9", 1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"endpoint": "node0"}, "expected HOST:PORT"),
        ({"endpoint": "node0:0"}, "fixed port"),
        ({"endpoint": "node0:1", "token_file": "a", "token_env": "B"}, "not both"),
        ({"endpoint": "node0:1", "tls_cert": "c"}, "go together"),
        ({"endpoint": "node0:1", "mutual_tls": True}, "mutual_tls needs"),
        ({"endpoint": "node0:1", "colour": "blue"}, "Extra inputs"),
    ],
)
def test_options_are_checked(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GrpcOptions.model_validate(options)
    assert GrpcOptions(endpoint="[::1]:29400").endpoint == "[::1]:29400"
