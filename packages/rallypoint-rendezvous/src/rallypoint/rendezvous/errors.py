"""Errors raised by the rendezvous.

Every error says what happened and what to do; timeouts carry a :class:`TimeoutInfo` that names
the timeout, its value, and the nodes that were present and missing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from rallypoint.core.errors import EXIT_USAGE, RallypointError
from rallypoint.core.wait_more import WaitMore

__all__ = [
    "MAX_WAIT_MORE",
    "MAX_WAIT_MORE_TIMES",
    "GiveUp",
    "RendezvousBackendError",
    "RendezvousClosedError",
    "RendezvousError",
    "RendezvousFinishedError",
    "RendezvousHeartbeatError",
    "RendezvousJobMismatchError",
    "RendezvousStateError",
    "RendezvousTimeoutError",
    "TimeoutAnswer",
    "TimeoutInfo",
    "WaitMore",
    "extra_wait",
]

log = logging.getLogger("rallypoint.rendezvous")


class RendezvousError(RallypointError):
    """Base of every rendezvous error."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous was closed (the job is over); no new round can start."""

    def __init__(self, run_id: str, detail: str = "") -> None:
        self.run_id = run_id
        msg = f"rendezvous {run_id!r} is closed: the job is over"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg + ". Start a new job with a different run_id to rendezvous again")


class RendezvousFinishedError(RendezvousClosedError):
    """The run id belongs to a job that had already ended when this node arrived.

    A finished run is never joined again (a requeued job must not silently do nothing): start
    the new job with a new run id. Exit code 2, like other usage errors.
    """

    exit_code = EXIT_USAGE

    def __init__(self, run_id: str, reason: str = "", *, failed: bool = False) -> None:
        self.run_id = run_id
        self.reason = reason
        self.failed = failed
        how = "failed" if failed else "ended"
        detail = f" ({reason})" if reason else ""
        RendezvousError.__init__(
            self,
            f"run id {run_id!r} belongs to a job that already {how}{detail}; a finished run cannot be "
            "joined again and no worker was started. To run the job again, give it a new run id "
            "(--run-id ID, or rendezvous.run_id in the job file)",
        )


class RendezvousJobMismatchError(RendezvousError):
    """Another job runs under the same run id: its fingerprint differs from this node's.

    Attributes:
        run_id: the run id both jobs use.
        theirs: the fingerprint published by the job's first node.
        ours: this node's fingerprint.
    """

    exit_code = EXIT_USAGE

    def __init__(self, run_id: str, theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> None:
        self.run_id = run_id
        self.theirs = dict(theirs)
        self.ours = dict(ours)
        keys = sorted(set(theirs) | set(ours))
        diff = "; ".join(
            f"{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in keys if theirs.get(k) != ours.get(k)
        )
        super().__init__(
            f"run id {run_id!r} is already used by a different job ({diff}); two jobs never share a "
            "run id. Give this job its own run id (--run-id ID, or rendezvous.run_id), or start every "
            "node with the same command line"
        )


class RendezvousHeartbeatError(RendezvousError):
    """A node could not write its heartbeat for too long: it fails, with the backend's error.

    Its peers take it for dead anyway (its record stopped changing), and it can no longer check
    theirs, so the agent stops its workers and exits instead of running on unwatched.
    """

    def __init__(self, node_id: str, run_id: str, attempts: int, seconds: float, error: BaseException) -> None:
        self.node_id = node_id
        self.error = error
        super().__init__(
            f"node {node_id!r} could not write its heartbeat to the rendezvous of run {run_id!r}: "
            f"{attempts} attempt(s) over {seconds:.1f}s failed, the last with {type(error).__name__}: {error}. "
            "Its peers take it for dead and it cannot watch them; check that the rendezvous backend "
            "is reachable and writable (for 'file': the directory exists and may be written)"
        )


class RendezvousStateError(RendezvousError):
    """The shared rendezvous state is corrupt, foreign or unreadable."""


class RendezvousBackendError(RendezvousError):
    """The backend could not be reached or failed an operation."""


@dataclass(frozen=True)
class TimeoutInfo:
    """What timed out, passed to ``rallypoint_rendezvous_timed_out`` and kept on the error.

    Attributes:
        run_id: the job's run id.
        round: the round being formed.
        timeout: which timeout expired: ``"join"``, ``"close"`` or ``"last_call"``.
        seconds: its configured value.
        node_id: the node that observed the timeout.
        present: node ids that had joined the round.
        missing: node ids known to be missing (members of the previous round that did not rejoin).
        min_nodes: how many nodes the round needed.
        max_nodes: how many nodes the round admits.
    """

    run_id: str
    round: int
    timeout: str
    seconds: float
    node_id: str
    present: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    min_nodes: int = 1
    max_nodes: int = 1
    extra: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """One paragraph for users."""
        present = ", ".join(self.present) if self.present else "none"
        short = max(0, self.min_nodes - len(self.present))
        missing = ", ".join(self.missing) if self.missing else ("unknown nodes" if short else "none")
        text = (
            f"rendezvous {self.run_id!r} round {self.round}: the {self.timeout} timeout "
            f"({self.seconds:g}s) expired on node {self.node_id!r}; present ({len(self.present)}): {present}; "
            f"missing: {missing}"
        )
        if short:
            text += f"; {short} more node(s) needed to reach min_nodes={self.min_nodes}"
        return text


class RendezvousTimeoutError(RendezvousError):
    """A rendezvous timeout expired. ``info`` names the timeout and the nodes."""

    def __init__(self, info: TimeoutInfo, hint: str = "") -> None:
        self.info = info
        tail = hint or (
            f"Check that every node runs with run_id {info.run_id!r} against the same backend, "
            f"or raise rendezvous.{info.timeout}_timeout"
        )
        super().__init__(f"{info.describe()}. {tail}")

    @classmethod
    def of(cls, info: TimeoutInfo) -> RendezvousTimeoutError:
        """Build the error for ``info``."""
        return cls(info)


#: The longest extension one ``rallypoint_rendezvous_timed_out`` answer obtains (longer ones are cut).
MAX_WAIT_MORE = 3600.0
#: How many times the hook may extend one wait (one ``next_rendezvous`` call, or one close).
MAX_WAIT_MORE_TIMES = 10


@dataclass(frozen=True)
class GiveUp:
    """A ``rallypoint_rendezvous_timed_out`` answer: raise the timeout error now (the default).

    Attributes:
        reason: logged with the error.
    """

    reason: str = ""


TimeoutAnswer: TypeAlias = WaitMore | GiveUp


def extra_wait(answers: Iterable[object], info: TimeoutInfo, extensions: int) -> float | None:
    """Combine the hook's answers: the seconds to wait more, or ``None`` to give up.

    A :class:`GiveUp` from any plugin wins; otherwise the longest :class:`WaitMore`, cut to
    :data:`MAX_WAIT_MORE`. ``None`` answers (hooks written before answers existed) count for
    nothing; other values are ignored with a warning. After :data:`MAX_WAIT_MORE_TIMES`
    extensions the node gives up whatever the answers.
    """
    seconds: float | None = None
    for answer in answers:
        if isinstance(answer, GiveUp):
            if answer.reason:
                log.warning("rendezvous: a timed_out hook gives up: %s", answer.reason)
            return None
        if isinstance(answer, WaitMore):
            seconds = max(seconds or 0.0, float(answer.seconds))
        elif answer is not None:
            log.warning(
                "rendezvous: a rallypoint_rendezvous_timed_out hook returned %r; expected WaitMore(seconds), "
                "GiveUp() or None: ignored",
                answer,
            )
    if seconds is None:
        return None
    if extensions >= MAX_WAIT_MORE_TIMES:
        log.warning(
            "rendezvous: the %s timeout was already extended %d times (the most allowed): giving up",
            info.timeout,
            extensions,
        )
        return None
    if seconds > MAX_WAIT_MORE:
        log.warning("rendezvous: WaitMore(%g) cut to %gs", seconds, MAX_WAIT_MORE)
        seconds = MAX_WAIT_MORE
    log.warning("rendezvous: %s; a timed_out hook waits %gs more", info.describe(), seconds)
    return seconds
