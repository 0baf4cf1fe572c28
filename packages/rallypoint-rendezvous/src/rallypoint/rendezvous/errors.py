"""Errors raised by the rendezvous.

Every error says what happened and what to do; timeouts carry a :class:`TimeoutInfo` that names
the timeout, its value, and the nodes that were present and missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rallypoint.core.errors import RallypointError

__all__ = [
    "RendezvousBackendError",
    "RendezvousClosedError",
    "RendezvousError",
    "RendezvousStateError",
    "RendezvousTimeoutError",
    "TimeoutInfo",
]


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
