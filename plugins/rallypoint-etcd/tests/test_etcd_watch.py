"""How soon a watch wakes after the write it waits for (real etcd server).

etcd serves a watch that starts at a past revision from a catch-up loop that runs every 100 ms;
only a watch at the store's next revision gets each write as it commits. The backend's watch read
the key, then watched from the read's revision: a write anywhere in the store between the two
(other nodes joining) made the watch one that starts in the past, and the wake-up came up to
100 ms late. A two-node rendezvous took 50-110 ms instead of about 20.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from typing import Any

from rallypoint_etcd.backend import EtcdBackend
from rallypoint_etcd.client import EtcdClient
from rallypoint_etcd.options import EtcdOptions


class BusyStore(EtcdClient):
    """The real client; its first read of ``watched`` is followed by a write elsewhere in the store,
    and ``writer`` writes the watched key ``delay`` seconds later (recording when it sent the write:
    the watch may wake before the writer has its answer)."""

    def __init__(self, options: EtcdOptions, watched: str, writer: EtcdBackend, delay: float) -> None:
        super().__init__(options)
        self.watched = watched
        self.writer = writer
        self.delay = delay
        self.written_at: list[float] = []

    def get(self, key: str) -> Any:
        found = super().get(key)
        if key.endswith("kv/" + self.watched) and not self.written_at:
            self.writer.set("elsewhere", uuid.uuid4().hex)  # the store's revision moves on
            threading.Thread(target=self._write_later, daemon=True).start()
        return found

    def _write_later(self) -> None:
        time.sleep(self.delay)
        self.written_at.append(time.monotonic())
        self.writer.set(self.watched, "changed")


def test_a_watch_wakes_within_milliseconds_of_the_write_while_the_store_is_busy(etcd_options: EtcdOptions) -> None:
    latencies = []
    for i in range(20):
        run_id = f"watch-{uuid.uuid4().hex[:8]}"
        writer = EtcdBackend(run_id, etcd_options)
        writer.set("header", "initial")
        entry = writer.get("header")
        assert entry is not None
        client = BusyStore(etcd_options, "header", writer, delay=0.01)
        watcher = EtcdBackend(run_id, etcd_options, client=client)
        try:
            assert watcher.watch("header", version=entry.version, timeout=5.0), f"sample {i}: no wake-up"
            woke = time.monotonic()
            assert client.written_at, f"sample {i}: woke before the write"
            latencies.append(woke - client.written_at[0])
        finally:
            watcher.close()
            writer.close()
    # the write comes 10 ms after the watch starts. Served by the catch-up loop, the watch woke
    # 67-194 ms after it (mean 83 ms); at the next revision it wakes in 2-7 ms (mean 2.5 ms)
    mean = statistics.mean(latencies)
    assert mean < 0.025, f"mean wake-up {mean * 1000:.1f} ms after the write: {[round(x * 1000, 1) for x in latencies]}"


def test_a_wait_leaves_no_thread_and_no_stream_behind(etcd_options: EtcdOptions) -> None:
    """Each wait is one watch stream read by the waiting thread, closed when the wait ends.

    The library's shared watcher kept a thread (and a stream) per process once a first watch
    was made, waking on its own: with 64 node processes on two cores, CPU taken from the round.
    """
    run_id = f"watch-{uuid.uuid4().hex[:8]}"
    backend = EtcdBackend(run_id, etcd_options)
    try:
        version = backend.set("header", "initial")
        before = {t.ident for t in threading.enumerate()}
        assert not backend.watch("header", version=version, timeout=0.2)  # timed out: no change
        assert backend.watch("header", version=version - 1, timeout=5.0)  # changed before the watch
        threading.Thread(target=lambda: (time.sleep(0.1), backend.set("header", "changed")), daemon=True).start()
        assert backend.watch("header", version=version, timeout=5.0)  # woken by the write
        time.sleep(0.2)  # the writer thread ends
        after = {t.ident for t in threading.enumerate()}
        assert after <= before, [t.name for t in threading.enumerate() if t.ident not in before]
    finally:
        backend.close()


def test_a_wait_starts_no_thread_while_it_waits(etcd_options: EtcdOptions) -> None:
    """A wait sends one request on its stream and reads the answers: no thread feeds the stream.

    Opened as a bidirectional call, gRPC started a thread per watch to send the request from an
    iterator (a thread per node and wait, with 64 node processes on two cores).
    """
    run_id = f"watch-{uuid.uuid4().hex[:8]}"
    backend = EtcdBackend(run_id, etcd_options)
    seen: list[str] = []
    reads: list[str] = []
    real = backend.client.get

    def get(key: str) -> Any:  # the wait's own read, made once the watch is set up
        reads.append(key)
        seen.extend(t.name for t in threading.enumerate() if t.ident not in before)
        return real(key)

    try:
        version = backend.set("header", "initial")
        backend.watch("header", version=version, timeout=0.05)  # the first watch sets the stub up
        before = {t.ident for t in threading.enumerate()}
        backend.client.get = get  # type: ignore[method-assign]
        assert not backend.watch("header", version=version, timeout=0.2)
        assert len(reads) == 1  # the threads were looked at while the watch was open
        assert seen == [], seen
    finally:
        backend.close()
