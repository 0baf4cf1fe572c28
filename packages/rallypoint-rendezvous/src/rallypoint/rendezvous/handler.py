"""The rendezvous handler: runs the state machine against a backend.

:class:`RendezvousHandler` is what an agent uses: :meth:`~RendezvousHandler.next_rendezvous`
blocks until this node is a member of a completed round and returns a
:class:`RendezvousResult`. Waiting is watch-driven (the backend wakes the handler when the
round header changes, see :class:`~rallypoint.rendezvous.state.Wait`); heartbeats run in a
background thread.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from rallypoint.rendezvous.backend import Entry, RendezvousBackend
from rallypoint.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousStateError,
    RendezvousTimeoutError,
    TimeoutInfo,
)
from rallypoint.rendezvous.state import (
    HEADER_KEY,
    ROUND_PREFIX,
    TICKET_KEY,
    Action,
    CasHeader,
    Closed,
    Finished,
    Header,
    JoinRecord,
    NeedHeartbeats,
    NeedJoins,
    NodeInfo,
    RemoveJoins,
    RendezvousStateMachine,
    Settings,
    TimedOut,
    View,
    Wait,
    WriteJoin,
    count_key,
    heartbeat_key,
    join_key,
    join_prefix,
    nodes_waiting,
)
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = [
    "RendezvousHandler",
    "default_node",
    "RendezvousResult",
    "RoundIO",
    "WorkerStoreInfo",
    "free_port",
    "open_backend",
]

#: Rounds older than ``round - KEEP_ROUNDS`` are garbage-collected when a round opens.
KEEP_ROUNDS = 2


@dataclass(frozen=True)
class WorkerStoreInfo:
    """Where workers find their store (torch ``env://``): group rank 0's address and port.

    Attributes:
        master_addr: value for ``MASTER_ADDR``.
        master_port: value for ``MASTER_PORT``, chosen at run time by rank 0's node.
    """

    master_addr: str
    master_port: int


@dataclass(frozen=True)
class RendezvousResult:
    """The outcome of a completed round, identical on every member (except ``group_rank``).

    Attributes:
        run_id: the job's run id.
        round: the round number.
        group_rank: this node's rank among the nodes (0..num_nodes-1).
        num_nodes: the number of nodes in the round.
        participants: every member's record, in group-rank order.
        store: the workers' store address (``MASTER_ADDR``/``MASTER_PORT``).
    """

    run_id: str
    round: int
    group_rank: int
    num_nodes: int
    participants: tuple[NodeInfo, ...]
    store: WorkerStoreInfo

    @property
    def node(self) -> NodeInfo:
        """The record of the node that owns this result."""
        return self.participants[self.group_rank]


def free_port(host: str = "") -> int:
    """A TCP port that was free a moment ago (bind to port 0, then release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _heartbeat_value(entry: Entry | None) -> Any:
    return None if entry is None else entry.value


class RoundIO:
    """Executes state-machine actions against a backend (the only I/O of the algorithm).

    Shared by the handler and the tests, so both run exactly the same protocol.
    """

    def __init__(self, backend: RendezvousBackend, machine: RendezvousStateMachine) -> None:
        self.backend = backend
        self.machine = machine
        self._hb_seq = 0

    # -- reads ---------------------------------------------------------------------------
    def read(self) -> View:
        """Read the header and the join counter (one prefix list)."""
        entries = self.backend.list(ROUND_PREFIX)
        raw = entries.get(HEADER_KEY)
        header = Header() if raw is None else Header.from_json(raw.value)
        count = entries.get(count_key(header.round))
        value = 0 if count is None else count.value
        if not isinstance(value, int):
            raise RendezvousStateError(f"malformed rendezvous join counter {count_key(header.round)!r}: {value!r}")
        return View(header, None if raw is None else raw.version, value)

    def read_joins(self, round_: int) -> dict[str, JoinRecord]:
        """The join records of ``round_``, by node id."""
        prefix = join_prefix(round_)
        out = {}
        for key, entry in self.backend.list(prefix).items():
            record = JoinRecord.from_json(entry.value)
            if key[len(prefix) :] != record.node.node_id:
                raise RendezvousStateError(f"rendezvous join record {key!r} names node {record.node.node_id!r}")
            out[record.node.node_id] = record
        return out

    def read_heartbeats(self, ids: tuple[str, ...]) -> dict[str, Any]:
        """The heartbeat values of ``ids`` (``None`` when absent)."""
        return {i: _heartbeat_value(self.backend.get(heartbeat_key(i))) for i in ids}

    def decide(self, now: float) -> tuple[Action, View]:
        """Read what the machine needs and return its action (not yet applied)."""
        view = self.read()
        for _ in range(4):
            action = self.machine.step(view, now)
            if isinstance(action, NeedJoins):
                view = replace(view, joins=self.read_joins(view.header.round))
            elif isinstance(action, NeedHeartbeats):
                view = replace(view, heartbeats=self.read_heartbeats(action.node_ids))
            else:
                return action, view
        raise AssertionError("rendezvous state machine asked for data repeatedly")  # pragma: no cover

    # -- writes --------------------------------------------------------------------------
    def heartbeat(self) -> None:
        """Rewrite this node's own heartbeat record (the only key a heartbeat touches)."""
        self._hb_seq += 1
        self.backend.set(heartbeat_key(self.machine.node_id), {"inc": self.machine.incarnation, "seq": self._hb_seq})

    def ensure_ticket(self) -> None:
        """Take an arrival ticket once per incarnation."""
        if self.machine.ticket is None:
            self.machine.set_ticket(self.backend.add(TICKET_KEY, 1))

    def apply(self, action: Action) -> bool:
        """Carry out a write action; returns False when a compare-and-set lost a race."""
        b = self.backend
        if isinstance(action, WriteJoin):
            key = join_key(action.round, self.machine.node_id)
            written, _ = b.compare_and_set(key, action.record.to_json(), version=None)
            if written:
                b.add(count_key(action.round), 1)
            else:  # a record of an earlier incarnation (or attempt): replace it, already counted
                b.set(key, action.record.to_json())
            self.machine.joined(action.round)
            return True
        if isinstance(action, RemoveJoins):
            for node_id in action.node_ids:
                if b.delete(join_key(action.round, node_id)):
                    b.add(count_key(action.round), -1)
            return True
        if isinstance(action, CasHeader):
            ok, _ = b.compare_and_set(HEADER_KEY, action.header.to_json(), version=action.expected)
            if ok and not action.header.complete and not action.header.closed:
                self._collect_garbage(action.header.round - KEEP_ROUNDS - 1)
            return ok
        return True

    def withdraw(self) -> None:
        """Remove this incarnation's join records from open rounds (after a timeout, or when leaving)."""
        b = self.backend
        me = self.machine.node_id
        h = self.read().header
        for r in (h.round, h.round + 1):
            entry = b.get(join_key(r, me))
            if (
                entry is not None
                and isinstance(entry.value, dict)
                and entry.value.get("inc") == self.machine.incarnation
                and not (h.complete and r == h.round)
                and b.delete(join_key(r, me), version=entry.version)
            ):
                b.add(count_key(r), -1)
        self.machine.forget_joins()

    def _collect_garbage(self, round_: int) -> None:
        if round_ < 0:
            return
        for key in self.backend.list(join_prefix(round_)):
            self.backend.delete(key)
        self.backend.delete(count_key(round_))

    def result(self, finished: Finished) -> RendezvousResult:
        """Build the result of a finished round from the members' join records."""
        h = finished.header
        joins = self.read_joins(h.round)
        members = []
        for m in h.participants:
            record = joins.get(m.node_id)
            if record is None or record.incarnation != m.incarnation:
                raise RendezvousStateError(
                    f"rendezvous round {h.round} lists node {m.node_id!r} but its join record "
                    f"join/{h.round}/{m.node_id} is missing or from another incarnation"
                )
            members.append(record.node)
        first = members[0]
        port = first.master_port if first.master_port is not None else 0
        return RendezvousResult(
            run_id=self.backend.run_id,
            round=h.round,
            group_rank=finished.rank,
            num_nodes=len(members),
            participants=tuple(members),
            store=WorkerStoreInfo(first.addr, port),
        )


def open_backend(section: Any, pm: Any = None) -> RendezvousBackend:
    """Open the backend a config ``[rendezvous]`` section names.

    Looks the name up in the plugin registry, validates ``options`` with the backend's own
    model and calls its factory with ``(run_id, options)``.
    """
    from rallypoint.core.plugins import get_plugin_manager
    from rallypoint.core.registry import RENDEZVOUS_BACKENDS

    pm = pm or get_plugin_manager()
    record = pm.registry(RENDEZVOUS_BACKENDS).get(section.backend, where="rendezvous.backend")
    record.check_requirements(RENDEZVOUS_BACKENDS.label)
    options: Any = dict(section.options or {})
    if record.options_model is not None:
        options = record.options_model.model_validate(options)
    factory = record.load()
    return factory(section.run_id or "default", options)  # type: ignore[no-any-return]


class RendezvousHandler:
    """One node's rendezvous.

    Args:
        backend: the key-value space (see :mod:`rallypoint.rendezvous.backend`).
        node: this node's record. ``master_port=None`` picks a free port per round.
        min_nodes: the smallest round.
        max_nodes: the largest round.
        timeouts: every timeout (build it from config with :meth:`RendezvousTimeouts.from_section`).
        pm: plugin manager whose ``rallypoint_rendezvous_completed`` / ``_timed_out`` hooks fire.
        clock: monotonic clock (tests may pass a fake one).
        incarnation: unique id of this process incarnation (random by default).
    """

    def __init__(
        self,
        backend: RendezvousBackend,
        node: NodeInfo,
        *,
        min_nodes: int,
        max_nodes: int,
        timeouts: RendezvousTimeouts | None = None,
        pm: Any = None,
        clock: Callable[[], float] = time.monotonic,
        incarnation: str | None = None,
    ) -> None:
        self.backend = backend
        self.timeouts = timeouts or RendezvousTimeouts()
        self.settings = Settings(min_nodes, max_nodes, self.timeouts, backend.run_id)
        self._fixed_port = node.master_port
        self.machine = RendezvousStateMachine(node, incarnation or secrets.token_hex(8), self.settings)
        self.io = RoundIO(backend, self.machine)
        self.pm = pm
        self.clock = clock
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: RendezvousResult | None = None
        self._shut = False

    @classmethod
    def from_config(
        cls, section: Any, node: NodeInfo, *, min_nodes: int, max_nodes: int, pm: Any = None
    ) -> RendezvousHandler:
        """Build a handler from a config ``RendezvousSection`` (backend, run id, timeouts)."""
        from rallypoint.core.plugins import get_plugin_manager

        pm = pm or get_plugin_manager()
        return cls(
            open_backend(section, pm),
            node,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            timeouts=RendezvousTimeouts.from_section(section),
            pm=pm,
        )

    # -- public API ----------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        """The job's run id."""
        return self.backend.run_id

    @property
    def node_id(self) -> str:
        """The id of the node this handler represents."""
        return self.machine.node_id

    @property
    def last_result(self) -> RendezvousResult | None:
        """The result of the last completed round, if any."""
        return self._last

    def update_node(self, **changes: Any) -> NodeInfo:
        """Change this node's record for the next round (e.g. ``previous_rank``); returns it.

        The record is published when the node joins its next round; the current round's
        members keep the record they read. ``node_id`` cannot change.
        """
        if "node_id" in changes:
            raise ValueError("a node's id cannot change; start a new handler for another node")
        with self._lock:
            self.machine.node = replace(self.machine.node, **changes)
            return self.machine.node

    def next_rendezvous(self) -> RendezvousResult:
        """Block until this node is a member of a completed round.

        Called again after a round completed, it asks for a new round (membership change).

        Raises:
            RendezvousClosedError: the rendezvous is closed.
            RendezvousTimeoutError: the join timeout expired (the ``rallypoint_rendezvous_timed_out``
                hook has fired).
            RendezvousStateError: the shared state is corrupt or foreign.
        """
        if self._shut:
            raise RendezvousStateError(f"rendezvous handler of node {self.node_id!r} was shut down")
        with self._lock:
            if self._fixed_port is None:
                self.machine.node = replace(self.machine.node, master_port=free_port())
            self.io.ensure_ticket()
            self.machine.begin(self.clock())
        self._start_heartbeats()
        while True:
            with self._lock:
                action, view = self.io.decide(self.clock())
                if isinstance(action, Finished):
                    result = self.io.result(action)
                    self._last = result
                    break
                if isinstance(action, Closed):
                    raise RendezvousClosedError(self.run_id)
                if isinstance(action, TimedOut):
                    self.io.withdraw()
                    self._fire_timeout(action.info)
                    raise RendezvousTimeoutError(action.info)
                if not isinstance(action, Wait):
                    self.io.apply(action)
                    continue
            timeout = max(0.0, action.until - self.clock())
            if timeout > 0:
                # Watch the header from the version this step read: a change made since then
                # (the round completed, a new round opened) returns at once, so no wake-up is lost.
                self.backend.watch(HEADER_KEY, version=view.header_version, timeout=min(timeout, 3600.0))
        if self.pm is not None:
            self.pm.hook.rallypoint_rendezvous_completed(info=result)
        return result

    def is_closed(self) -> bool:
        """Whether the rendezvous was closed (the job is over)."""
        with self._lock:
            return self.io.read().header.closed

    def set_closed(self) -> None:
        """Close the rendezvous for every node: the job is over; later rounds fail.

        Raises:
            RendezvousTimeoutError: the close did not succeed within the close timeout.
        """
        deadline = self.clock() + self.timeouts.close
        while True:
            with self._lock:
                view = self.io.read()
                action = self.machine.close_header(view)
                if action is None or self.io.apply(action):
                    return
            if self.clock() >= deadline:
                info = TimeoutInfo(
                    self.run_id,
                    view.header.round,
                    "close",
                    self.timeouts.close,
                    self.node_id,
                    min_nodes=self.settings.min_nodes,
                    max_nodes=self.settings.max_nodes,
                )
                self._fire_timeout(info)
                raise RendezvousTimeoutError(info, "Another node kept rewriting the round header")

    def num_nodes_waiting(self) -> int:
        """How many nodes wait for a new round (see :func:`~rallypoint.rendezvous.state.nodes_waiting`).

        Non-zero also when the running round is over (a member left, restarted or stopped
        heart-beating): the agent should stop its workers and call :meth:`next_rendezvous`.
        """
        with self._lock:
            last = self.machine.last_round
            view = self.io.read()
            h = view.header
            if last is None:
                return 0
            if h.round > last:
                entry = self.backend.get(count_key(h.round))
                return nodes_waiting(last, h, 0 if entry is None else int(entry.value), self.settings.max_nodes)
            entry = self.backend.get(count_key(h.round + 1))
            return nodes_waiting(last, h, 0 if entry is None else int(entry.value), self.settings.max_nodes)

    def round_is_over(self) -> bool:
        """Whether the round this node last completed has been superseded or closed."""
        with self._lock:
            last = self.machine.last_round
            h = self.io.read().header
            return last is not None and (h.closed or h.round > last)

    def shutdown(self, *, close: bool = False) -> bool:
        """Leave: stop heartbeats and withdraw this node (and close the job when ``close``).

        Leaving a running round opens the next one, so the other members notice. Idempotent.

        Returns:
            True (the torch handler contract).
        """
        if self._shut:
            return True
        self._shut = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeouts.heartbeat_interval + 5)
        with contextlib.suppress(Exception):
            if close:
                self.set_closed()
            else:
                with self._lock:
                    view = self.io.read()
                    action = self.machine.leave_header(view)
                    if action is not None:
                        self.io.apply(action)
                    self.io.withdraw()
            self.backend.delete(heartbeat_key(self.node_id))
        return True

    # -- internals -----------------------------------------------------------------------
    def _fire_timeout(self, info: TimeoutInfo) -> None:
        if self.pm is not None:
            self.pm.hook.rallypoint_rendezvous_timed_out(info=info)

    def _start_heartbeats(self) -> None:
        if self._thread is not None:
            return
        # The first beat comes one interval from now, not at once: a peer that reads no
        # heartbeat record yet starts its timeout from that observation, and the record changes
        # (appears) well within heartbeat_timeout. Writing at once would put N more writes
        # into the moment N nodes join together.
        self._thread = threading.Thread(
            target=self._heartbeat_loop, name=f"rallypoint-heartbeat-{self.node_id}", daemon=True
        )
        self._thread.start()

    def _heartbeat_loop(self) -> None:
        interval = self.timeouts.heartbeat_interval
        while not self._stop.wait(interval):
            try:
                with self._lock:
                    self.io.heartbeat()
                    if self.machine.last_round is None or self.machine.join_deadline != float("inf"):
                        continue  # next_rendezvous checks liveness while joining
                    view = self.io.read()
                    peers = self.machine.watched_peers(view.header)
                    view = replace(view, heartbeats=self.io.read_heartbeats(peers))
                    action = self.machine.check_peers(view, self.clock())
                    if action is not None:
                        self.io.apply(action)
            except Exception:  # noqa: BLE001 - a transient backend error must not kill heartbeats
                continue


def default_node(
    local_world_size: int = 1,
    *,
    node_id: str | None = None,
    addr: str | None = None,
    labels: Mapping[str, str] | None = None,
    master_port: int | None = None,
) -> NodeInfo:
    """A node record for the current host: id ``<host>-<pid>`` unless given."""
    host = socket.gethostname()
    return NodeInfo(
        node_id=node_id or f"{host}-{os.getpid()}",
        host=host,
        addr=addr or host,
        local_world_size=local_world_size,
        labels=dict(labels or {}),
        master_port=master_port,
    )
