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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rallypoint.rendezvous.backend import RendezvousBackend
from rallypoint.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousStateError,
    RendezvousTimeoutError,
    TimeoutInfo,
)
from rallypoint.rendezvous.factory import open_backend, select_backend
from rallypoint.rendezvous.round_io import KEEP_ROUNDS, RendezvousResult, RoundIO, WorkerStoreInfo, free_port
from rallypoint.rendezvous.state import (
    HEADER_KEY,
    Closed,
    Finished,
    NodeInfo,
    RendezvousStateMachine,
    Settings,
    TimedOut,
    Wait,
    count_key,
    heartbeat_key,
    nodes_waiting,
)
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

if TYPE_CHECKING:
    from rallypoint.core.config import Selection
    from rallypoint.core.plugins import RallypointPluginManager
    from rallypoint.rendezvous.config import RendezvousSection

__all__ = [
    "KEEP_ROUNDS",
    "RendezvousHandler",
    "RendezvousResult",
    "RoundIO",
    "WorkerStoreInfo",
    "default_node",
    "free_port",
    "open_backend",
    "select_backend",
]


class RendezvousHandler:
    """One node's rendezvous.

    Three ways to build one:

    * :meth:`from_selection`: from a job's resolved config (what ``rallypoint run`` does): the
      backend core resolved and validated, and the typed timeouts;
    * :meth:`from_config`: from a ``[rendezvous]`` section alone (library users, tools);
    * the constructor: from a backend object you opened yourself.

    Args:
        backend: the key-value space (see :mod:`rallypoint.rendezvous.backend`).
        node: this node's record. ``master_port=None`` picks a free port per round.
        min_nodes: the smallest round.
        max_nodes: the largest round.
        timeouts: every timeout (the defaults of :class:`RendezvousTimeouts` when omitted).
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
        pm: RallypointPluginManager | None = None,
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
    def from_selection(
        cls,
        selection: Selection,
        node: NodeInfo,
        *,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        timeouts: RendezvousTimeouts,
        pm: RallypointPluginManager | None = None,
    ) -> RendezvousHandler:
        """Build a handler from a job's resolved rendezvous selection and its typed timeouts.

        The selection's options were validated by core's config resolution; they are handed to
        the backend's factory as they are (see :func:`~rallypoint.rendezvous.factory.open_backend`).

        Args:
            selection: ``resolved.selection("rendezvous.backend")`` (record + validated options).
            node: this node's record.
            run_id: the job's run id (``rendezvous.run_id``, or the one generated for a standalone job).
            min_nodes: ``nodes.min``.
            max_nodes: ``nodes.max``.
            timeouts: ``RendezvousTimeouts.from_section(<the [rendezvous] section>)``.
            pm: the plugin manager whose rendezvous hooks fire.
        """
        backend = open_backend(selection, run_id)
        return cls(backend, node, min_nodes=min_nodes, max_nodes=max_nodes, timeouts=timeouts, pm=pm)

    @classmethod
    def from_config(
        cls,
        section: RendezvousSection,
        node: NodeInfo,
        *,
        min_nodes: int,
        max_nodes: int,
        pm: RallypointPluginManager | None = None,
    ) -> RendezvousHandler:
        """Build a handler from a ``[rendezvous]`` section that no job resolution has seen.

        For library users and tools: looks the backend up and validates ``section.options``
        (once, with :func:`~rallypoint.rendezvous.factory.select_backend`). A job that went
        through core's resolution uses :meth:`from_selection` instead. The run id defaults to
        ``"default"``.
        """
        from rallypoint.core.plugins import get_plugin_manager

        pm = pm or get_plugin_manager()
        selection = select_backend(section.backend, section.options, pm=pm)
        return cls.from_selection(
            selection,
            node,
            run_id=section.run_id or "default",
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
