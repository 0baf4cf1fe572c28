"""Truthful outcomes at the rendezvous: finished runs, foreign jobs, failed closes, dead heartbeats."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from rallypoint.rendezvous.backend import JSONValue, Version
from rallypoint.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousFinishedError,
    RendezvousHeartbeatError,
    RendezvousJobMismatchError,
    RendezvousStateError,
)
from rallypoint.rendezvous.handler import RendezvousHandler
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.state import CLOSED_KEY, HEADER_KEY, JOB_KEY, TICKET_KEY
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

FAST = RendezvousTimeouts(join=20, last_call=0.1, close=5, heartbeat_interval=0.05, heartbeat_timeout=0.4)


def _until(cond: Any, what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.fixture
def run_id() -> str:
    return f"outcomes-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def handlers() -> Iterator[list[RendezvousHandler]]:
    made: list[RendezvousHandler] = []
    yield made
    for h in made:
        h.shutdown()


def _handler(
    made: list[RendezvousHandler], run_id: str, i: int, nodes: int, *, backend: Any = None, **kw: Any
) -> RendezvousHandler:
    kw.setdefault("timeouts", FAST)
    h = RendezvousHandler(backend or MemoryBackend(run_id), make_node(i), min_nodes=nodes, max_nodes=nodes, **kw)
    made.append(h)
    return h


def test_a_finished_run_is_refused_before_joining(run_id: str, handlers: list[RendezvousHandler]) -> None:
    first = _handler(handlers, run_id, 0, 1)
    first.next_rendezvous()
    first.set_closed("job succeeded (closed by node 'node0')")
    tickets = MemoryBackend(run_id).get(TICKET_KEY)
    again = _handler(handlers, run_id, 1, 1)
    with pytest.raises(RendezvousFinishedError) as caught:
        again.next_rendezvous()
    message = str(caught.value)
    assert f"run id {run_id!r} belongs to a job that already ended" in message
    assert "job succeeded (closed by node 'node0')" in message
    assert "new run id" in message
    assert caught.value.exit_code == 2
    assert isinstance(caught.value, RendezvousClosedError)  # torch's agent still sees a closed rendezvous
    assert MemoryBackend(run_id).get(TICKET_KEY) == tickets  # it took nothing in the finished run


def test_a_run_closed_as_failed_says_so(run_id: str, handlers: list[RendezvousHandler]) -> None:
    first = _handler(handlers, run_id, 0, 1)
    first.next_rendezvous()
    first.set_closed("job failed (closed by node 'node0')", failed=True)
    with pytest.raises(RendezvousFinishedError, match="already failed") as caught:
        _handler(handlers, run_id, 1, 1).next_rendezvous()
    assert caught.value.failed


def test_a_member_sees_why_the_job_was_closed_in_one_status_read(
    run_id: str, handlers: list[RendezvousHandler]
) -> None:
    a, b = _handler(handlers, run_id, 0, 2), _handler(handlers, run_id, 1, 2)
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(b.next_rendezvous()))
    thread.start()
    a.next_rendezvous()
    thread.join(timeout=30)
    assert len(results) == 1
    status = b.round_status()
    assert (status.closed, status.failed, status.waiting) == (False, False, 0)
    a.set_closed("job failed (closed by node 'node0')", failed=True)
    status = b.round_status()
    assert (status.closed, status.failed) == (True, True)
    assert status.reason == "job failed (closed by node 'node0')"
    assert b.num_nodes_waiting() == 0


def test_two_jobs_under_one_run_id_do_not_merge(run_id: str, handlers: list[RendezvousHandler]) -> None:
    job = {"entrypoint": "train.py", "args": ["--lr", "0.1"], "nodes": [2, 2]}
    other = {"entrypoint": "eval.py", "args": [], "nodes": [2, 2]}
    first = _handler(handlers, run_id, 0, 2, fingerprint=job)
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(first.next_rendezvous()))
    thread.start()
    _until(lambda: MemoryBackend(run_id).get(JOB_KEY) is not None, "the first node did not publish its job")
    with pytest.raises(RendezvousJobMismatchError) as caught:
        _handler(handlers, run_id, 1, 2, fingerprint=other).next_rendezvous()
    message = str(caught.value)
    assert f"run id {run_id!r} is already used by a different job" in message
    assert "entrypoint: 'train.py' there, 'eval.py' here" in message
    assert "args: ['--lr', '0.1'] there, [] here" in message
    assert caught.value.exit_code == 2
    # a node of the same job still joins, and the round completes with it, not with the intruder
    same = _handler(handlers, run_id, 2, 2, fingerprint=dict(job))
    mine = same.next_rendezvous()
    thread.join(timeout=30)
    assert [p.node_id for p in mine.participants] == [p.node_id for p in results[0].participants]
    assert {p.node_id for p in mine.participants} == {"node0", "node2"}


def test_a_node_of_another_job_takes_no_ticket(run_id: str, handlers: list[RendezvousHandler]) -> None:
    """Refused at check-in: it neither joins nor counts among the job's arrivals."""
    first = _handler(handlers, run_id, 0, 1, fingerprint={"entrypoint": "train.py"})
    first.next_rendezvous()
    tickets = MemoryBackend(run_id).get(TICKET_KEY)
    with pytest.raises(RendezvousJobMismatchError):
        _handler(handlers, run_id, 1, 1, fingerprint={"entrypoint": "eval.py"}).next_rendezvous()
    assert MemoryBackend(run_id).get(TICKET_KEY) == tickets


def test_a_node_arriving_while_a_close_is_under_way_checks_its_job_and_joins(
    run_id: str, handlers: list[RendezvousHandler]
) -> None:
    """The closing marker is written just before the header is closed: a node that sees the marker
    but an open header (the close not written yet, or failed) takes its ticket and claims the run
    id in separate steps, and the rendezvous goes on as before the marker."""
    backend = MemoryBackend(run_id)
    backend.set(CLOSED_KEY, {"by": "node9", "reason": "", "failed": False})
    job = {"entrypoint": "train.py"}
    result = _handler(handlers, run_id, 0, 1, fingerprint=job).next_rendezvous()
    assert result.num_nodes == 1
    claimed = backend.get(JOB_KEY)
    assert claimed is not None
    assert claimed.value == job
    ticket = backend.get(TICKET_KEY)
    assert ticket is not None
    assert ticket.value == 1
    with pytest.raises(RendezvousJobMismatchError):
        _handler(handlers, run_id, 1, 1, fingerprint={"entrypoint": "eval.py"}).next_rendezvous()


def test_closing_writes_the_marker_before_the_closed_header(run_id: str, handlers: list[RendezvousHandler]) -> None:
    order: list[str] = []

    class Recording(MemoryBackend):
        def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
            order.append(f"set {key}")
            return super().set(key, value, ttl=ttl)

        def compare_and_set(self, key: str, value: JSONValue, *, version: Any, ttl: float | None = None) -> Any:
            if isinstance(value, dict) and value.get("closed"):
                order.append(f"close {key}")
            return super().compare_and_set(key, value, version=version, ttl=ttl)

    first = _handler(handlers, run_id, 0, 1, backend=Recording(run_id))
    first.next_rendezvous()
    first.set_closed("job succeeded")
    assert order[-2:] == [f"set {CLOSED_KEY}", f"close {HEADER_KEY}"], order
    marker = MemoryBackend(run_id).get(CLOSED_KEY)
    assert marker is not None
    assert marker.value == {"by": "node0", "reason": "job succeeded", "failed": False}


class FlakyHeartbeats(MemoryBackend):
    """A memory backend whose heartbeat writes fail while ``failures_left`` is positive (or forever)."""

    def __init__(self, run_id: str, error: Exception | None = None) -> None:
        super().__init__(run_id, shared=False)
        self.failures_left = 0
        self.forever = False
        self.failed = 0
        self.error = error or OSError(30, "Read-only file system", "/shared/rdzv/kv/hb")

    def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
        if key.startswith("hb/") and (self.forever or self.failures_left > 0):
            self.failures_left -= 1
            self.failed += 1
            raise self.error
        return super().set(key, value, ttl=ttl)


def test_a_heartbeat_that_finds_the_state_corrupt_fails_the_node_at_once(
    run_id: str, handlers: list[RendezvousHandler]
) -> None:
    """A corrupt or vanished state is no outage to ride out: the node fails on the first such beat.

    It was retried for ``heartbeat_timeout`` like an unreachable backend, so a node waiting for
    peers learnt of a rewound or deleted file-backend directory only after the timeout.
    """
    backend = FlakyHeartbeats(run_id, RendezvousStateError("revision counter in /shared/rdzv/lock went back"))
    h = _handler(handlers, run_id, 0, 1, backend=backend)  # heartbeat_timeout 0.4 s, interval 0.05 s
    h.timeouts = replace(h.timeouts, heartbeat_timeout=30.0)
    h.next_rendezvous()
    backend.forever = True
    _until(lambda: h.failure is not None, "the node did not fail on a corrupt state", seconds=5)
    assert backend.failed == 1
    # the state error itself, as the join loop would raise it: not "could not write its heartbeat"
    assert isinstance(h.failure, RendezvousStateError)
    assert "went back" in str(h.failure)
    with pytest.raises(RendezvousStateError, match="went back"):
        h.next_rendezvous()


def test_a_heartbeat_that_keeps_failing_fails_the_node(run_id: str, handlers: list[RendezvousHandler]) -> None:
    backend = FlakyHeartbeats(run_id)
    h = _handler(handlers, run_id, 0, 1, backend=backend)
    h.next_rendezvous()
    assert h.num_nodes_waiting() == 0
    backend.forever = True
    with pytest.raises(RendezvousHeartbeatError) as caught:  # noqa: PT012 - polls until the node fails
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            h.num_nodes_waiting()
            time.sleep(0.02)
    message = str(caught.value)
    assert "node 'node0' could not write its heartbeat" in message
    assert "OSError: [Errno 30] Read-only file system" in message
    assert backend.failed >= 2  # retried before the node failed (heartbeat_timeout 0.4 s, interval 0.05 s)
    assert h.failure is caught.value
    with pytest.raises(RendezvousHeartbeatError):
        h.round_status()
    with pytest.raises(RendezvousHeartbeatError):
        h.next_rendezvous()


def test_a_transient_heartbeat_error_is_retried(run_id: str, handlers: list[RendezvousHandler]) -> None:
    backend = FlakyHeartbeats(run_id)
    h = _handler(handlers, run_id, 0, 1, backend=backend)
    h.next_rendezvous()
    backend.failures_left = 2  # 0.1 s of failures: well within heartbeat_timeout (0.4 s)
    _until(lambda: backend.failures_left <= 0, "the heartbeat was not retried")
    before = backend.get("hb/node0")
    _until(lambda: backend.get("hb/node0") != before, "heartbeats did not resume after the errors")
    assert h.failure is None
    assert h.num_nodes_waiting() == 0


def test_round_status_reads_closed_and_superseded_in_one_header(run_id: str, handlers: list[RendezvousHandler]) -> None:
    # the agent's exit barrier decides from one read: a close by another node must never look like
    # a membership change (it did when "closed" and "round over" came from two reads)
    a, b = _handler(handlers, run_id, 0, 2), _handler(handlers, run_id, 1, 2)
    threads = [threading.Thread(target=h.next_rendezvous) for h in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert a.round_status().superseded is False
    b.set_closed("job succeeded (closed by node 'node1')")
    status = a.round_status()
    assert (status.closed, status.failed, status.superseded) == (True, False, False)


class HangingHeartbeats(MemoryBackend):
    """A memory backend whose heartbeat writes hang (a cut link: no answer, no error) once ``hang`` is set."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id, shared=False)
        self.hang = threading.Event()
        self.release = threading.Event()
        self.hanging = 0

    def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
        if key.startswith("hb/") and self.hang.is_set():
            self.hanging += 1
            self.release.wait(60)  # the call returns only when the test ends
            raise OSError(110, "Connection timed out")
        return super().set(key, value, ttl=ttl)


def test_a_heartbeat_that_hangs_fails_the_node_within_heartbeat_timeout(
    run_id: str, handlers: list[RendezvousHandler]
) -> None:
    """The verdict comes from the clock, not from the call: a hung write must not postpone it.

    The node failed only once a beat *raised*, and then only after three raised, so a backend
    call that hung for its own timeout (10 s for etcd) stretched a 2 s heartbeat timeout to 30 s
    and more, while the node's workers trained on with a world that had dropped it.
    """
    backend = HangingHeartbeats(run_id)
    h = _handler(handlers, run_id, 0, 1, backend=backend, timeouts=replace(FAST, heartbeat_timeout=0.5))
    h.next_rendezvous()
    try:
        _until(lambda: h.failure is None and backend.get("hb/node0") is not None, "a first heartbeat", seconds=5)
        hung_at = time.monotonic()
        backend.hang.set()
        _until(lambda: h.failure is not None, "the node did not fail while its heartbeat hung", seconds=5)
        failed_after = time.monotonic() - hung_at
        assert backend.hanging == 1  # the verdict came while the one beat still hung
        assert failed_after < 0.5 + 0.3, failed_after
        assert isinstance(h.failure, RendezvousHeartbeatError)
        assert "a heartbeat call has waited" in str(h.failure)
        # the monitor's read does not wait on the hung beat's lock either: it raises the failure
        started = time.monotonic()
        with pytest.raises(RendezvousHeartbeatError):
            h.round_status()
        assert time.monotonic() - started < 0.2
    finally:
        backend.release.set()


def test_a_close_for_a_superseded_round_closes_nothing(run_id: str, handlers: list[RendezvousHandler]) -> None:
    """The outcome of round r ends the job only while r is the current round.

    A node cut off from the rendezvous (its peers dropped it and went on in round r+1) whose old
    workers then failed, or finished, closed the job as failed (or succeeded) for everyone when
    its link came back.
    """
    a, b = _handler(handlers, run_id, 0, 2), _handler(handlers, run_id, 1, 2)
    threads = [threading.Thread(target=h.next_rendezvous) for h in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    old = a.last_result
    assert old is not None

    def next_round() -> None:
        with contextlib.suppress(RendezvousClosedError):  # the test closes the job at the end
            b.next_rendezvous()

    threading.Thread(target=next_round, daemon=True).start()  # b opens round r+1
    _until(lambda: a.round_status().superseded, "round r+1 opened")
    assert a.set_closed("job failed (closed by node 'node0')", failed=True, round_=old.round) is False
    status = a.round_status()
    assert (status.closed, status.failed) == (False, False)
    assert MemoryBackend(run_id).get(CLOSED_KEY) is None  # no marker left behind: nodes may still check in
    assert a.set_closed("job succeeded", round_=old.round + 1) is True
    assert a.round_status().closed
