"""Atomic add on etcd: one transaction per add, however many nodes add at once (real etcd server).

The add writes one arrival key per call and reads the counter with its arrivals in the same
transaction (see :mod:`rallypoint_etcd.backend`); these tests check that no add retries, and that
every other operation on such a counter keeps the protocol's contract.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from rallypoint_etcd import backend as backend_module
from rallypoint_etcd.backend import EtcdBackend
from rallypoint_etcd.client import EtcdClient
from rallypoint_etcd.options import EtcdOptions


class CountingClient(EtcdClient):
    """The real client, counting the requests it sends by kind (``transaction``, ``range``, ...)."""

    def __init__(self, options: EtcdOptions) -> None:
        super().__init__(options)
        self.requests: Counter[str] = Counter()

    def _call(self, what: str, fn: Any) -> Any:
        self.requests[what] += 1
        return super()._call(what, fn)


def _run_id() -> str:
    return f"add-{uuid.uuid4().hex[:10]}"


def _raw_keys(options: EtcdOptions, run_id: str) -> list[str]:
    """Every etcd key of the run under ``kv/``, read straight from etcd."""
    client = EtcdClient(options)
    try:
        kvs, _ = client.get_prefix(options.base_key(run_id) + "kv/")
        return sorted(k[len(options.base_key(run_id) + "kv/") :] for k in kvs)
    finally:
        client.close()


@pytest.mark.parametrize("counter_exists", [False, True])
def test_concurrent_adds_never_retry(etcd_options: EtcdOptions, counter_exists: bool) -> None:
    """N clients add at once: N transactions in all, and each gets its own position 1..N."""
    n = 16
    run_id = _run_id()
    clients = [CountingClient(etcd_options) for _ in range(n)]
    backends = [EtcdBackend(run_id, etcd_options, client=c) for c in clients]
    backends[0].set("warm", 0)  # creates the run lease (the first write of a run creates it, then writes again)
    start = 0
    if counter_exists:
        start = backends[0].add("round/count/0", 5)
    before = [c.requests["transaction"] for c in clients]
    barrier = threading.Barrier(n)
    got: list[int] = []
    lock = threading.Lock()

    def adder(b: EtcdBackend) -> None:
        barrier.wait()
        value = b.add("round/count/0", 1)
        with lock:
            got.append(value)

    threads = [threading.Thread(target=adder, args=(b,)) for b in backends]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    transactions = sum(c.requests["transaction"] for c in clients) - sum(before)
    for b in backends:
        b.close()
    assert sorted(got) == list(range(start + 1, start + n + 1))
    assert transactions == n, f"{n} concurrent adds took {transactions} transactions (retries on conflict)"


def test_add_counts_once_when_sent_again(etcd_options: EtcdOptions) -> None:
    """A transaction sent again after a lost answer rewrites the same arrival: the add counts once."""
    run_id = _run_id()
    backend = EtcdBackend(run_id, etcd_options)
    assert backend.add("n", 2) == 2
    k = backend._kv + "n"
    arrival = f"{k}#again"
    for _ in range(2):
        backend.client.add_arrival(k, arrival, b"3", zero=b"0", lease=backend.lease, end=k + "$")
    entry = backend.get("n")
    assert entry is not None
    assert entry.value == 5
    backend.close()


def test_operations_on_a_counter_see_the_sum(etcd_options: EtcdOptions) -> None:
    """get, list, compare-and-set, set and delete treat the key and its arrivals as one value."""
    run_id = _run_id()
    backend = EtcdBackend(run_id, etcd_options)
    for i in range(3):
        assert backend.add("c/n", 1) == i + 1
    entry = backend.get("c/n")
    assert entry is not None
    assert entry.value == 3
    assert backend.list("c/") == {"c/n": entry}
    assert backend.list("") == {"c/n": entry}
    # A version read before an add is stale afterwards; a failed compare-and-set returns the sum.
    assert backend.add("c/n", 2) == 5
    ok, current = backend.compare_and_set("c/n", 100, version=entry.version)
    assert not ok
    assert current is not None
    assert current.value == 5
    ok, current = backend.compare_and_set("c/n", 100, version=None)
    assert not ok
    assert current is not None
    assert current.value == 5
    ok, written = backend.compare_and_set("c/n", 10, version=current.version)
    assert ok
    assert written is not None
    assert written.value == 10
    assert _raw_keys(etcd_options, run_id) == ["c/n"], "a write must remove the arrivals it replaces"
    assert backend.add("c/n", -1) == 9
    backend.set("c/n", 7)
    assert _raw_keys(etcd_options, run_id) == ["c/n"]
    assert backend.add("c/n", 1) == 8
    entry = backend.get("c/n")
    assert entry is not None
    assert not backend.delete("c/n", version=written.version)
    assert backend.delete("c/n", version=entry.version)
    assert backend.get("c/n") is None
    assert _raw_keys(etcd_options, run_id) == []
    assert backend.add("c/n", 1) == 1
    assert backend.delete("c/n")
    assert not backend.delete("c/n")
    assert _raw_keys(etcd_options, run_id) == []
    backend.close()


def test_add_to_a_non_integer_leaves_it_as_it_was(etcd_options: EtcdOptions) -> None:
    run_id = _run_id()
    backend = EtcdBackend(run_id, etcd_options)
    backend.set("t", "text")
    with pytest.raises(TypeError, match="not an integer"):
        backend.add("t", 1)
    entry = backend.get("t")
    assert entry is not None
    assert entry.value == "text"
    assert _raw_keys(etcd_options, run_id) == ["t"]
    backend.close()


def test_watches_wake_on_add(etcd_options: EtcdOptions) -> None:
    run_id = _run_id()
    backend, other = EtcdBackend(run_id, etcd_options), EtcdBackend(run_id, etcd_options)
    backend.add("w/n", 1)
    entry = backend.get("w/n")
    assert entry is not None
    assert not backend.watch("w/n", version=entry.version, timeout=0.2)
    snapshot = {k: e.version for k, e in backend.list("w/").items()}
    assert not backend.watch_prefix("w/", versions=snapshot, timeout=0.2)
    t = threading.Timer(0.1, lambda: other.add("w/n", 1))
    t.start()
    assert backend.watch("w/n", version=entry.version, timeout=30)
    t.join()
    snapshot = {k: e.version for k, e in backend.list("w/").items()}
    t = threading.Timer(0.1, lambda: other.add("w/n", 1))
    t.start()
    assert backend.watch_prefix("w/", versions=snapshot, timeout=30)
    t.join()
    backend.close()
    other.close()


def test_arrivals_of_an_expired_key_do_not_count(etcd_options: EtcdOptions) -> None:
    """A key written with a TTL and then added to: when it expires, the counter starts again from 0."""
    run_id = _run_id()
    backend = EtcdBackend(run_id, etcd_options)
    version = backend.set("lease/n", 5, ttl=1)
    assert backend.add("lease/n", 1) == 6
    entry = backend.get("lease/n")
    assert entry is not None
    assert entry.version != version
    deadline = time.monotonic() + 15
    while backend.get("lease/n") is not None and time.monotonic() < deadline:
        backend.watch("lease/n", version=entry.version, timeout=1)
    assert backend.get("lease/n") is None
    assert backend.list("lease/") == {}
    assert backend.add("lease/n", 1) == 1
    backend.close()


def test_many_arrivals_are_folded(etcd_options: EtcdOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_module, "FOLD_AT", 3)
    run_id = _run_id()
    backend = EtcdBackend(run_id, etcd_options)
    assert [backend.add("f", 1) for _ in range(10)] == list(range(1, 11))
    assert len(_raw_keys(etcd_options, run_id)) <= 5
    entry = backend.get("f")
    assert entry is not None
    assert entry.value == 10
    backend.close()


def test_the_first_write_of_a_run_is_one_request(etcd_options: EtcdOptions) -> None:
    """The run lease is created, and the client registered, when the backend connects.

    The first write of every node used to find no lease, create it and write again: three
    requests instead of one, and a fourth (the registration) at the same moment.
    """
    client = CountingClient(etcd_options)
    backend = EtcdBackend(_run_id(), etcd_options, client=client)
    try:
        assert client.requests["lease grant"] == 1  # when connecting
        assert client.requests["put"] == 1
        client.requests.clear()
        assert backend.add("round/ticket", 1) == 1
        # nor does the client register itself now (its lease keeper did, in the same moment)
        assert dict(client.requests) == {"transaction": 1}
    finally:
        backend.close()


def test_the_last_node_to_shut_down_removes_the_runs_keys(etcd_options: EtcdOptions) -> None:
    """``shutdown(close=True)`` of a handler that opened its backend closes it: the last one out revokes the run.

    The backends were closed only at interpreter exit, so a closed job's keys stayed for as long
    as the process that ran it (a torchrun agent, a notebook) lived on.
    """
    from concurrent.futures import ThreadPoolExecutor

    from rallypoint.rendezvous.config import RendezvousSection
    from rallypoint.rendezvous.handler import RendezvousHandler, default_node

    run_id = f"close-{uuid.uuid4().hex[:8]}"
    section = RendezvousSection(
        backend="etcd",
        run_id=run_id,
        join_timeout=30,
        last_call_timeout=0.5,
        options={"endpoints": etcd_options.endpoints, "namespace": etcd_options.namespace, "retry_timeout": 5},
    )
    handlers = [
        RendezvousHandler.from_config(
            section, default_node(node_id=f"n{i}", addr="127.0.0.1"), min_nodes=2, max_nodes=2
        )
        for i in range(2)
    ]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda h: h.next_rendezvous(), handlers))
    assert sorted(r.group_rank for r in results) == [0, 1]
    client = EtcdClient(etcd_options)
    try:
        base = etcd_options.base_key(run_id)
        assert client.get_prefix(base)[0], "the round left no keys to remove"
        handlers[0].shutdown(close=True)
        assert client.get_prefix(base)[0], "the other node is still there: the run stays"
        handlers[1].shutdown(close=True)
        assert client.get_prefix(base)[0] == {}
    finally:
        client.close()


def test_a_join_is_one_transaction(etcd_options: EtcdOptions) -> None:
    """A node's join (its record created only if absent, then the round's counter) is one request.

    It was a compare-and-set and then an add: two transactions, two raft commits per node.
    """
    from rallypoint.rendezvous.actions import Settings, WriteJoin
    from rallypoint.rendezvous.keyspace import NodeInfo
    from rallypoint.rendezvous.round_io import RoundIO
    from rallypoint.rendezvous.state import RendezvousStateMachine
    from rallypoint.rendezvous.timeouts import RendezvousTimeouts

    client = CountingClient(etcd_options)
    backend = EtcdBackend(_run_id(), etcd_options, client=client)
    try:
        for name in ("a", "b"):
            machine = RendezvousStateMachine(
                NodeInfo(node_id=name, host="h", addr="127.0.0.1"),
                f"inc-{name}",
                Settings(1, 4, RendezvousTimeouts(), backend.run_id),
            )
            client.requests.clear()
            assert RoundIO(backend, machine).apply(WriteJoin(0, machine.record_for(0)))
            assert dict(client.requests) == {"transaction": 1}
        entry = backend.get("round/count/0")
        assert entry is not None
        assert entry.value == 2
        assert sorted(backend.list("join/0/")) == ["join/0/a", "join/0/b"]
    finally:
        backend.close()


def test_a_check_in_is_one_transaction(etcd_options: EtcdOptions) -> None:
    """A node's first contact (the round read, the job's fingerprint claimed, an arrival ticket) is one request.

    It was a range read, a compare-and-set of the job key and an add: three requests per node,
    sent by every node of a job in the same moment.
    """
    from rallypoint.rendezvous.backend import check_in

    client = CountingClient(etcd_options)
    backend = EtcdBackend(_run_id(), etcd_options, client=client)
    try:
        backend.set("round/header", {"round": 0})
        for ticket in (1, 2):
            client.requests.clear()
            done = check_in(backend, "round/", "ticket", unless="round/closed", claim=("job", {"cmd": "train.py"}))
            assert dict(client.requests) == {"transaction": 1}
            assert done.count == ticket
            assert done.entries["round/header"].value == {"round": 0}
        client.requests.clear()
        done = check_in(backend, "round/", "ticket", unless="round/closed")
        assert (dict(client.requests), done.count) == ({"transaction": 1}, 3)
    finally:
        backend.close()


def test_a_check_in_sent_again_counts_once(etcd_options: EtcdOptions) -> None:
    """An answer lost on the way back: the same transaction sent again finds its claim and rewrites its arrival."""
    run_id = _run_id()
    backend = EtcdBackend(run_id, etcd_options)
    client = EtcdClient(etcd_options)
    try:
        kv = etcd_options.base_key(run_id) + "kv/"
        request = (
            (kv + "round/", kv + "round0"),
            kv + "round/closed",
            (kv + "ticket", kv + "ticket#once", b"1", kv + "ticket$"),
        )
        for _ in range(2):
            _, counted, claimed = client.check_in(*request, lease=backend.lease, claim=(kv + "job", b'{"j":1}'))
            assert counted is not None
            assert claimed is not None
            assert claimed.value == b'{"j":1}'
        entry = backend.get("ticket")
        assert entry is not None
        assert entry.value == 1
    finally:
        client.close()
        backend.close()
