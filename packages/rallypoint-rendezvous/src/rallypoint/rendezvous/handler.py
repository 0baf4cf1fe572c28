"""The rendezvous handler: runs the state machine against a backend.

:class:`RendezvousHandler` is what an agent uses: :meth:`~RendezvousHandler.next_rendezvous`
blocks until this node is a member of a completed round and returns a
:class:`RendezvousResult`. Waiting is watch-driven (the backend wakes the handler when the
round header changes, see :class:`~rallypoint.rendezvous.state.Wait`); heartbeats run in a
background thread.

A handler's first :meth:`~RendezvousHandler.next_rendezvous` refuses a run that has already
ended (:class:`~rallypoint.rendezvous.errors.RendezvousFinishedError`) and, when the handler was
given the job's fingerprint, a run id that another job already uses
(:class:`~rallypoint.rendezvous.errors.RendezvousJobMismatchError`). A node whose heartbeat
has not been written for ``heartbeat_timeout`` (failing, or waiting for the backend) has failed:
every later call raises :class:`~rallypoint.rendezvous.errors.RendezvousHeartbeatError`, and
:attr:`RendezvousHandler.failure` says so without I/O (see :mod:`rallypoint.rendezvous.heartbeat`).
A heartbeat that finds the run's state gone or corrupt fails the node at once with that
:class:`~rallypoint.rendezvous.errors.RendezvousStateError`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rallypoint.rendezvous.backend import HeldWatch, RendezvousBackend
from rallypoint.rendezvous.errors import (
    RendezvousBackendError,
    RendezvousClosedError,
    RendezvousFinishedError,
    RendezvousHeartbeatError,
    RendezvousJobMismatchError,
    RendezvousStateError,
    RendezvousTimeoutError,
    TimeoutInfo,
    extra_wait,
)
from rallypoint.rendezvous.factory import open_backend, select_backend
from rallypoint.rendezvous.heartbeat import Heartbeat
from rallypoint.rendezvous.result import RoundStatus
from rallypoint.rendezvous.round_io import KEEP_ROUNDS, RendezvousResult, RoundIO, WorkerStoreInfo, free_port
from rallypoint.rendezvous.seats import Assign
from rallypoint.rendezvous.state import (
    CLOSED_KEY,
    JOB_KEY,
    Closed,
    Finished,
    Header,
    NodeInfo,
    RendezvousStateMachine,
    Settings,
    TimedOut,
    View,
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
    from rallypoint.rendezvous.spec import RendezvousSpec

__all__ = [
    "KEEP_ROUNDS",
    "RendezvousHandler",
    "RendezvousResult",
    "RoundStatus",
    "RoundIO",
    "WorkerStoreInfo",
    "default_node",
    "free_port",
    "open_backend",
    "select_backend",
]

log = logging.getLogger("rallypoint.rendezvous")


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
        fingerprint: what this job runs (JSON values; e.g. entry point, arguments, node range).
            The job's first node publishes it; a node whose fingerprint differs is refused with
            :class:`~rallypoint.rendezvous.errors.RendezvousJobMismatchError`. ``None``: not checked.
        owns_backend: :meth:`shutdown` closes ``backend`` (``False``: whoever opened it closes it).
        assign: the assignment function (see :mod:`rallypoint.rendezvous.seats`): given the
            members' records in group-rank order, one JSON value per member. The node that
            completes a round runs it once and each member receives its own value
            (:attr:`RendezvousResult.assigned`) with its seat, instead of every node reading the
            whole roster to compute it. ``None``: no assignment (``assigned`` is ``None``).
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
        fingerprint: Mapping[str, Any] | None = None,
        owns_backend: bool = False,
        assign: Assign | None = None,
    ) -> None:
        self.backend = backend
        self._owns_backend = owns_backend
        self.timeouts = timeouts or RendezvousTimeouts()
        self.settings = Settings(min_nodes, max_nodes, self.timeouts, backend.run_id)
        self._fixed_port = node.master_port
        self.machine = RendezvousStateMachine(node, incarnation or secrets.token_hex(8), self.settings)
        self.io = RoundIO(backend, self.machine, assign)
        self.pm = pm
        self.clock = clock
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._heartbeat = Heartbeat(node.node_id, backend.run_id, self.timeouts, self._beat, clock, self._stop)
        self._last: RendezvousResult | None = None
        self._shut = False
        self._fingerprint = dict(fingerprint) if fingerprint is not None else None
        self._checked_in = False

    @classmethod
    def from_spec(
        cls, spec: RendezvousSpec, node: NodeInfo, *, pm: RallypointPluginManager | None = None
    ) -> RendezvousHandler:
        """Open the backend a :class:`~rallypoint.rendezvous.spec.RendezvousSpec` names and build the handler.

        Args:
            spec: the backend (its validated options), the run id, the node range, the timeouts
                and the job's fingerprint, decided once (the agent's plan).
            node: this node's record.
            pm: the plugin manager whose rendezvous hooks fire.
        """
        return cls(
            open_backend(spec.backend, spec.run_id),
            node,
            min_nodes=spec.min_nodes,
            max_nodes=spec.max_nodes,
            timeouts=spec.timeouts,
            pm=pm,
            fingerprint=spec.fingerprint or None,
            owns_backend=True,
        )

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
        fingerprint: Mapping[str, Any] | None = None,
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
            fingerprint: what the job runs (see the class); ``None``: not checked.
        """
        backend = open_backend(selection, run_id)
        return cls(
            backend,
            node,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            timeouts=timeouts,
            pm=pm,
            fingerprint=fingerprint,
            owns_backend=True,
        )

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
    def assign(self) -> Assign | None:
        """The assignment function the node that completes a round runs (see the class); settable before a round."""
        return self.io.assign

    @assign.setter
    def assign(self, function: Assign | None) -> None:
        self.io.assign = function

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
            RendezvousFinishedError: on the first call: the run had already ended.
            RendezvousJobMismatchError: on the first call: a different job uses this run id.
            RendezvousClosedError: the rendezvous is closed.
            RendezvousTimeoutError: the join timeout expired (the ``rallypoint_rendezvous_timed_out``
                hook has fired).
            RendezvousHeartbeatError: this node's heartbeat kept failing.
            RendezvousStateError: the shared state is corrupt or foreign.
        """
        if self._shut:
            raise RendezvousStateError(f"rendezvous handler of node {self.node_id!r} was shut down")
        self._raise_failure()
        held = self.io.hold_header_watch(self.timeouts.heartbeat_interval)
        try:
            return self._next_rendezvous(held)
        finally:
            if held is not None:
                held.close()

    def _next_rendezvous(self, held: HeldWatch | None) -> RendezvousResult:
        """:meth:`next_rendezvous`; ``held``: a watch on the header held since before its first read."""
        known: View | None = None  # a view the next step may use without reading again
        with self._lock:
            if not self._checked_in:
                known = self._check_in()
            if self._fixed_port is None:
                self.machine.node = replace(self.machine.node, master_port=free_port())
            self.io.ensure_ticket()
            self.machine.begin(self.clock())
        self._heartbeat.start()
        extended = 0
        while True:
            self._raise_failure()
            with self._lock:
                action, view = self.io.decide(self.clock(), known)
                known = None
                if isinstance(action, Finished):
                    result = self.io.result(action)
                    self._last = result
                    break
                if isinstance(action, Closed):
                    raise RendezvousClosedError(self.run_id)
                if isinstance(action, TimedOut):
                    more = self._fire_timeout(action.info, extended)
                    if more is not None:  # a hook answered WaitMore: stay in the round
                        extended += 1
                        self.machine.join_deadline = self.clock() + more
                        continue
                    self.io.withdraw()
                    raise RendezvousTimeoutError(action.info)
                if not isinstance(action, Wait):
                    self.io.apply(action)
                    known = self.io.view_after(action, view)
                    continue
            timeout = max(0.0, action.until - self.clock())
            if held is not None:  # the first wait: on the watch held since before the first read
                known, held = self.io.wait_held(held, view, timeout), None
            else:
                # Watch the header from the version this step read: a change made since then
                # (the round completed, a new round opened) returns at once, so no wake-up is lost.
                known = self.io.wait_header(view, timeout)
        if self.pm is not None:
            self.pm.hook.rallypoint_rendezvous_completed(info=result)
        return result

    def is_closed(self) -> bool:
        """Whether the rendezvous was closed (the job is over)."""
        with self._lock:
            return self.io.read().header.closed

    def round_status(self) -> RoundStatus:
        """Closed (and why), or how many nodes wait: what a member checks while its workers run.

        Raises:
            RendezvousHeartbeatError: this node's heartbeat kept failing; it must stop.
            RendezvousStateError: a heartbeat found the run's state gone or corrupt; it must stop.
        """
        self._raise_failure()
        # A heartbeat that waits for the backend holds the lock; the caller (a monitor) must not
        # wait longer than a beat would, nor past its own failure (see Heartbeat.failure).
        if not self._lock.acquire(timeout=self.timeouts.heartbeat_interval):
            self._raise_failure()
            raise RendezvousBackendError(
                f"node {self.node_id!r}'s heartbeat is still waiting for the rendezvous backend"
            )
        try:
            last = self.machine.last_round
            h = self.io.read().header
            waiting = self._waiting(h)
        finally:
            self._lock.release()
        superseded = last is not None and h.round > last
        return RoundStatus(closed=h.closed, failed=h.failed, reason=h.reason, waiting=waiting, superseded=superseded)

    def set_closed(self, reason: str = "", *, failed: bool = False, round_: int | None = None) -> bool:
        """Close the rendezvous for every node: the job is over; later rounds fail.

        Args:
            reason: why the job ends, e.g. ``"job succeeded (closed by node 'n0')"``; kept in
                the header, where every node and ``rallypoint status`` read it.
            failed: the job failed for good: members stop their workers and report the failure.
            round_: close only while this is the current round: an outcome of round ``r`` (its
                workers succeeded, or failed for good) is the job's outcome only while no newer
                round has opened (a node cut off and dropped meanwhile must never end the job
                its peers carry on). ``None``: whatever the round.

        Returns:
            ``True`` when the rendezvous is closed (by this call or before); ``False`` when a
            newer round than ``round_`` has opened: nothing was closed.

        Raises:
            RendezvousTimeoutError: the close did not succeed within the close timeout.
        """
        deadline = self.clock() + self.timeouts.close
        extended = 0
        marked = False
        while True:
            with self._lock:
                view = self.io.read()
                if round_ is not None and not view.header.closed and view.header.round != round_:
                    if marked:  # the marker of a close that did not happen: take it back
                        self.backend.delete(CLOSED_KEY)
                    return False
                action = self.machine.close_header(view, reason, failed=failed)
                if action is None:
                    return True
                if not marked:  # first the marker: from now on a node checking in takes no ticket
                    self.backend.set(CLOSED_KEY, {"by": self.node_id, "reason": reason, "failed": failed})
                    marked = True
                if self.io.apply(action):
                    return True
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
                more = self._fire_timeout(info, extended)
                if more is not None:
                    extended += 1
                    deadline = self.clock() + more
                    continue
                raise RendezvousTimeoutError(info, "Another node kept rewriting the round header")

    def num_nodes_waiting(self) -> int:
        """How many nodes wait for a new round (see :func:`~rallypoint.rendezvous.state.nodes_waiting`).

        Non-zero also when the running round is over (a member left, restarted or stopped
        heart-beating): the agent should stop its workers and call :meth:`next_rendezvous`.
        """
        self._raise_failure()
        with self._lock:
            return self._waiting(self.io.read().header)

    def _waiting(self, h: Header) -> int:
        last = self.machine.last_round
        if last is None or h.closed:
            return 0
        entry = self.backend.get(count_key(h.round if h.round > last else h.round + 1))
        return nodes_waiting(last, h, 0 if entry is None else int(entry.value), self.settings.max_nodes)

    def round_is_over(self) -> bool:
        """Whether the round this node last completed has been superseded or closed.

        Raises:
            RendezvousHeartbeatError: this node's heartbeat kept failing; it must stop.
            RendezvousStateError: a heartbeat found the run's state gone or corrupt; it must stop.
        """
        self._raise_failure()
        with self._lock:
            last = self.machine.last_round
            h = self.io.read().header
            return last is not None and (h.closed or h.round > last)

    def shutdown(self, *, close: bool = False) -> bool:
        """Leave: stop heartbeats and withdraw this node (and close the job when ``close``).

        Leaving a running round opens the next one, so the other members notice. A backend the
        handler opened itself (:meth:`from_selection`, :meth:`from_config`, torchrun's handlers)
        is closed last: its connections end, and a backend that cleans up after a closed job
        (etcd: the last client out revokes the run's keys) does so now, not at process exit.
        Idempotent.

        Returns:
            True (the torch handler contract).
        """
        if self._shut:
            return True
        self._shut = True
        self._stop.set()
        self._heartbeat.join(timeout=self.timeouts.heartbeat_interval + 5)
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
        if self._owns_backend:
            with contextlib.suppress(Exception):
                self.backend.close()
        return True

    @property
    def failure(self) -> RendezvousHeartbeatError | RendezvousStateError | None:
        """Why this node failed, or ``None``; no I/O, no lock (a fence may poll it).

        A :class:`RendezvousHeartbeatError` once its heartbeat has not been written for
        ``heartbeat_timeout`` (its peers take it for dead by then), even while a beat still
        waits for the backend; the :class:`RendezvousStateError` itself when a beat found the
        run's state gone or corrupt (the same error the join or the monitor raises when it sees
        that first).
        """
        return self._heartbeat.failure

    def clear_failure(self) -> RendezvousHeartbeatError | RendezvousStateError | None:
        """Forget this node's heartbeat failure, so that it may join a new round.

        For a caller that lost the rendezvous (its peers dropped it) and rejoins once the
        backend answers again: the next :meth:`next_rendezvous` starts the heartbeats again.

        Returns:
            The failure that was cleared, or ``None`` when the node had not failed.
        """
        return self._heartbeat.clear()

    # -- internals -----------------------------------------------------------------------
    def _raise_failure(self) -> None:
        failure = self._heartbeat.failure
        if failure is not None:
            raise failure

    def _check_in(self) -> View:
        """First contact: refuse a finished run, and a different job under the same run id.

        Returns the view it read (the first step may use it).
        """
        fingerprint = self._fingerprint
        view, entry = self.io.check_in(None if fingerprint is None else (JOB_KEY, fingerprint))
        header = view.header
        if header.closed:
            raise RendezvousFinishedError(self.run_id, header.reason, failed=header.failed)
        if fingerprint is not None:
            if entry is None:  # a close is under way (its marker stopped the claim): claim now
                _, entry = self.backend.compare_and_set(JOB_KEY, fingerprint, version=None)
            if entry is not None and entry.value != fingerprint:
                theirs = entry.value if isinstance(entry.value, dict) else {"job": entry.value}
                raise RendezvousJobMismatchError(self.run_id, theirs, fingerprint)
        self._checked_in = True
        return view

    def _fire_timeout(self, info: TimeoutInfo, extended: int) -> float | None:
        """Call the ``timed_out`` hooks: the seconds to wait more, or ``None`` (raise)."""
        if self.pm is None:
            return None
        return extra_wait(self.pm.hook.rallypoint_rendezvous_timed_out(info=info), info, extended)

    def _beat(self) -> None:
        """One heartbeat, and the liveness check of the watched peers while a round runs."""
        with self._lock:
            self.io.heartbeat()
            if self.machine.last_round is None or self.machine.join_deadline != float("inf"):
                return  # next_rendezvous checks liveness while joining
            view = self.io.read()
            peers = self.machine.watched_peers(view.header)
            view = replace(view, heartbeats=self.io.read_heartbeats(peers))
            action = self.machine.check_peers(view, self.clock())
            if action is not None:
                self.io.apply(action)


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
