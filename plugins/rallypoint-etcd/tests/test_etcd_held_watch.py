"""The held watch of the etcd backend (real etcd server): a watch stream set up before the reads it follows.

A node holds one on the round header from before its first read until its first wait; the wait
then needs no read to learn what changed meanwhile (see
:class:`~rallypoint.rendezvous.backend.SupportsHeldWatch`).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from rallypoint.rendezvous.backend import Entry, SupportsHeldWatch
from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint.rendezvous.handler import RendezvousHandler, RendezvousResult
from rallypoint.rendezvous.roster import ROSTERS
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts
from rallypoint_etcd.backend import EtcdBackend
from rallypoint_etcd.client import EtcdClient
from rallypoint_etcd.options import EtcdOptions


def _run_id() -> str:
    return f"held-{uuid.uuid4().hex[:10]}"


def _later(delay: float, fn: Any) -> None:
    threading.Thread(target=lambda: (time.sleep(delay), fn()), daemon=True).start()


def test_a_held_watch_reports_the_change_made_after_it_with_the_new_value(etcd_options: EtcdOptions) -> None:
    run_id = _run_id()
    backend, writer = EtcdBackend(run_id, etcd_options), EtcdBackend(run_id, etcd_options)
    try:
        assert isinstance(backend, SupportsHeldWatch)
        seen = backend.set("header", {"round": 0})
        held = backend.hold_watch("header", timeout=10)
        try:
            newer = writer.set("header", {"round": 1})  # before the wait: the held watch has it already
            change = held.wait(seen)
        finally:
            held.close()
        assert change is not None
        assert change.entry is not None
        assert (change.entry.value, change.entry.version) == ({"round": 1}, newer)
        assert backend.get("header") == change.entry
    finally:
        backend.close()
        writer.close()


def test_changes_the_caller_has_seen_are_skipped(etcd_options: EtcdOptions) -> None:
    run_id = _run_id()
    backend = EtcdBackend(run_id, etcd_options)
    try:
        held = backend.hold_watch("header", timeout=10)
        try:
            seen = backend.set("header", "read by the caller")  # after the hold, before its read
            _later(0.2, lambda: backend.set("header", "new"))
            started = time.monotonic()
            change = held.wait(seen)
        finally:
            held.close()
        assert time.monotonic() - started >= 0.15, "woken by a change the caller had seen"
        assert change is not None
        assert change.entry is not None
        assert change.entry.value == "new"
    finally:
        backend.close()


def test_a_held_watch_reports_a_deletion_and_ends_at_its_deadline(etcd_options: EtcdOptions) -> None:
    run_id = _run_id()
    backend = EtcdBackend(run_id, etcd_options)
    try:
        version = backend.set("header", 1)
        held = backend.hold_watch("header", timeout=10)
        assert backend.delete("header")
        change = held.wait(version)
        held.close()
        assert change is not None
        assert change.entry is None

        held = backend.hold_watch("header", timeout=0.3)
        assert 0 < held.remaining() <= 0.3
        started = time.monotonic()
        assert held.wait(None) is None
        assert 0.2 <= time.monotonic() - started < 3
        held.close()
        held.close()  # closing twice is harmless
    finally:
        backend.close()


def test_a_held_watch_that_breaks_says_so(etcd_options: EtcdOptions) -> None:
    backend = EtcdBackend(_run_id(), etcd_options)
    try:
        held = backend.hold_watch("header", timeout=10)
        held.close()  # cancelled under the waiter's feet
        with pytest.raises(RendezvousBackendError, match="watch"):
            held.wait(None)
    finally:
        backend.close()


class RecordingClient(EtcdClient):
    """The real client, recording the kind of each request in order (``watch``, ``range``, ...)."""

    def __init__(self, options: EtcdOptions) -> None:
        super().__init__(options)
        self.requests: list[str] = []

    def _call(self, what: str, fn: Any) -> Any:
        self.requests.append(what)
        return super()._call(what, fn)


def _join_wait_and_complete(
    options: EtcdOptions, waiter_backend: type[EtcdBackend] = EtcdBackend
) -> tuple[list[RendezvousResult], list[str], list[str], Entry | None]:
    """Node 0 joins a two-node round and waits (its requests recorded); then node 1 completes it.

    Returns both results, node 0's requests up to its wait and after it, and the round header
    once both have returned.
    """
    ROSTERS.clear()
    run_id = _run_id()
    timeouts = RendezvousTimeouts(join=60, last_call=30, close=5, heartbeat_interval=30, heartbeat_timeout=60)
    client = RecordingClient(options)
    waiting = RendezvousHandler(
        waiter_backend(run_id, options, client=client), make_node(0), min_nodes=2, max_nodes=2, timeouts=timeouts
    )
    completing = RendezvousHandler(
        EtcdBackend(run_id, options), make_node(1), min_nodes=2, max_nodes=2, timeouts=timeouts
    )
    results: list[RendezvousResult] = []
    try:
        client.requests.clear()  # what the backend sent when it connected
        t = threading.Thread(target=lambda: results.append(waiting.next_rendezvous()))
        t.start()
        time.sleep(1.0)  # it joins and waits
        joined = list(client.requests)
        results.append(completing.next_rendezvous())
        t.join(20)
        assert not t.is_alive()
        after = client.requests[len(joined) :]
        header = completing.backend.get("round/header")
    finally:
        waiting.shutdown()
        completing.shutdown()
    return results, joined, after, header


def test_a_waiting_node_sends_nothing_between_its_join_and_its_result(etcd_options: EtcdOptions) -> None:
    """A node that joins and waits for the round learns of its completion from the watch it holds.

    It used to open a watch after its join and read the header (did it change meanwhile?), then,
    once woken, read the round again: three requests per node, sent by 63 nodes at once when a
    64-node round completes. (The roster is not read either: this process's other node wrote it.)
    """
    results, joined, after, _ = _join_wait_and_complete(etcd_options)
    assert sorted(r.group_rank for r in results) == [0, 1]
    # the watch held from before the first read, the check-in (read and ticket), the join
    assert joined == ["watch", "transaction", "transaction"], joined
    assert after == [], after


def test_a_waiting_node_takes_the_roster_from_the_write_that_wakes_it(etcd_options: EtcdOptions) -> None:
    """The write that completes a round carries the roster record: a node in another process (no
    shared roster cache) that joined and waits reads nothing more either. It read the roster record
    after waking: one request per node, sent by 63 nodes at once when a 64-node round completes."""

    class Forgetful:  # the waiter's held watch: its process knows no roster when it wakes
        def __init__(self, held: Any) -> None:
            self.held = held

        def __getattr__(self, name: str) -> Any:
            return getattr(self.held, name)

        def wait(self, version: Any) -> Any:
            change = self.held.wait(version)
            ROSTERS.clear()
            return change

    class ForgetsOnWaking(EtcdBackend):
        def hold_watch(self, key: str, *, timeout: float) -> Any:
            return Forgetful(super().hold_watch(key, timeout=timeout))

    results, _, after, header = _join_wait_and_complete(etcd_options, ForgetsOnWaking)
    assert sorted(r.group_rank for r in results) == [0, 1]
    assert [p.node_id for p in results[0].participants] == [p.node_id for p in results[1].participants]
    assert after == [], after
    assert header is not None
    assert "inline_roster" not in header.value  # rewritten without it: reads of the running round stay small
