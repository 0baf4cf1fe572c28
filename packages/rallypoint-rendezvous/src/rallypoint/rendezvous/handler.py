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

The handler is the face; each of its jobs has a module named for it, working on the node's
shared :class:`~rallypoint.rendezvous.participant.Participant`: joining a round
(:mod:`~rallypoint.rendezvous.joining`), what a member checks while its workers run
(:mod:`~rallypoint.rendezvous.monitoring`), closing the job and leaving it
(:mod:`~rallypoint.rendezvous.closing`), and the heartbeat (:mod:`~rallypoint.rendezvous.heartbeat`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rallypoint.rendezvous import closing, joining, monitoring
from rallypoint.rendezvous.backend import RendezvousBackend
from rallypoint.rendezvous.errors import RendezvousHeartbeatError, RendezvousStateError
from rallypoint.rendezvous.factory import open_backend, select_backend
from rallypoint.rendezvous.participant import Participant
from rallypoint.rendezvous.result import RoundStatus
from rallypoint.rendezvous.round_io import KEEP_ROUNDS, RendezvousResult, RoundIO, WorkerStoreInfo, free_port
from rallypoint.rendezvous.seats import Assign
from rallypoint.rendezvous.state import NodeInfo, RendezvousStateMachine, Settings, heartbeat_key
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
        timeouts = timeouts or RendezvousTimeouts()
        settings = Settings(min_nodes, max_nodes, timeouts, backend.run_id)
        machine = RendezvousStateMachine(node, incarnation or secrets.token_hex(8), settings)
        self._participant = Participant(
            backend,
            machine,
            RoundIO(backend, machine, assign),
            timeouts,
            settings,
            pm,
            clock,
            fingerprint=dict(fingerprint) if fingerprint is not None else None,
            fixed_port=node.master_port,
        )
        #: set to stop the heartbeats (the conformance kit stops a node's heartbeats with it)
        self._stop = self._participant.stop
        self._owns_backend = owns_backend
        self._shut = False

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
    def backend(self) -> RendezvousBackend:
        """The key-value space."""
        return self._participant.backend

    @property
    def machine(self) -> RendezvousStateMachine:
        """The rendezvous state machine of this node."""
        return self._participant.machine

    @property
    def io(self) -> RoundIO:
        """The state machine's reads and writes against the backend."""
        return self._participant.io

    @property
    def settings(self) -> Settings:
        """The node range and timeouts the state machine decides with."""
        return self._participant.settings

    @property
    def timeouts(self) -> RendezvousTimeouts:
        """Every timeout (settable)."""
        return self._participant.timeouts

    @timeouts.setter
    def timeouts(self, value: RendezvousTimeouts) -> None:
        self._participant.timeouts = value

    @property
    def pm(self) -> RallypointPluginManager | None:
        """The plugin manager whose rendezvous hooks fire (settable)."""
        return self._participant.pm

    @pm.setter
    def pm(self, value: RallypointPluginManager | None) -> None:
        self._participant.pm = value

    @property
    def clock(self) -> Callable[[], float]:
        """The monotonic clock."""
        return self._participant.clock

    @property
    def run_id(self) -> str:
        """The job's run id."""
        return self._participant.run_id

    @property
    def node_id(self) -> str:
        """The id of the node this handler represents."""
        return self._participant.node_id

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
        return self._participant.last

    def update_node(self, **changes: Any) -> NodeInfo:
        """Change this node's record for the next round (e.g. ``previous_rank``); returns it.

        The record is published when the node joins its next round; the current round's
        members keep the record they read. ``node_id`` cannot change.
        """
        if "node_id" in changes:
            raise ValueError("a node's id cannot change; start a new handler for another node")
        with self._participant.lock:
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
        self._participant.raise_failure()
        held = self.io.hold_header_watch(self.timeouts.heartbeat_interval)
        try:
            return joining.join(self._participant, held)
        finally:
            if held is not None:
                held.close()

    def is_closed(self) -> bool:
        """Whether the rendezvous was closed (the job is over)."""
        return monitoring.is_closed(self._participant)

    def round_status(self) -> RoundStatus:
        """Closed (and why), or how many nodes wait: what a member checks while its workers run.

        Raises:
            RendezvousHeartbeatError: this node's heartbeat kept failing; it must stop.
            RendezvousStateError: a heartbeat found the run's state gone or corrupt; it must stop.
        """
        return monitoring.round_status(self._participant)

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
        return closing.close(self._participant, reason, failed=failed, round_=round_)

    def num_nodes_waiting(self) -> int:
        """How many nodes wait for a new round (see :func:`~rallypoint.rendezvous.state.nodes_waiting`).

        Non-zero also when the running round is over (a member left, restarted or stopped
        heart-beating): the agent should stop its workers and call :meth:`next_rendezvous`.
        """
        return monitoring.nodes_waiting(self._participant)

    def round_is_over(self) -> bool:
        """Whether the round this node last completed has been superseded or closed.

        Raises:
            RendezvousHeartbeatError: this node's heartbeat kept failing; it must stop.
            RendezvousStateError: a heartbeat found the run's state gone or corrupt; it must stop.
        """
        return monitoring.round_is_over(self._participant)

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
        self._participant.heartbeat.join(timeout=self.timeouts.heartbeat_interval + 5)
        with contextlib.suppress(Exception):
            if close:
                self.set_closed()
            else:
                closing.leave(self._participant)
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
        return self._participant.heartbeat.failure

    def clear_failure(self) -> RendezvousHeartbeatError | RendezvousStateError | None:
        """Forget this node's heartbeat failure, so that it may join a new round.

        For a caller that lost the rendezvous (its peers dropped it) and rejoins once the
        backend answers again: the next :meth:`next_rendezvous` starts the heartbeats again.

        Returns:
            The failure that was cleared, or ``None`` when the node had not failed.
        """
        return self._participant.heartbeat.clear()


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
