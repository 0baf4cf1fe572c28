"""The rendezvous timeouts, as one typed object configured in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RendezvousTimeouts"]


@dataclass(frozen=True)
class RendezvousTimeouts:
    """Every rendezvous timeout, in seconds.

    Attributes:
        join: how long :meth:`~rallypoint.rendezvous.handler.RendezvousHandler.next_rendezvous`
            waits for a round that includes this node.
        last_call: how long a round stays open after ``min`` nodes joined (it completes at once
            when ``max`` joined).
        close: how long closing the rendezvous may take.
        heartbeat_interval: how often a node refreshes its heartbeat record.
        heartbeat_timeout: a peer whose heartbeat record has not changed for this long, measured
            on the observer's own monotonic clock, is dead.
    """

    join: float = 600.0
    last_call: float = 5.0
    close: float = 30.0
    heartbeat_interval: float = 2.0
    heartbeat_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("join", "close", "heartbeat_interval", "heartbeat_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"rendezvous {name} timeout must be positive, got {value!r}")
        if self.last_call < 0:
            raise ValueError(f"rendezvous last_call timeout must be >= 0, got {self.last_call!r}")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ValueError(
                f"heartbeat_timeout ({self.heartbeat_timeout:g}s) must be longer than "
                f"heartbeat_interval ({self.heartbeat_interval:g}s)"
            )

    @classmethod
    def from_section(cls, section: Any) -> RendezvousTimeouts:
        """Build from a config ``RendezvousSection`` (or anything with the same attributes)."""
        return cls(
            join=float(section.join_timeout),
            last_call=float(section.last_call_timeout),
            close=float(section.close_timeout),
            heartbeat_interval=float(section.heartbeat_interval),
            heartbeat_timeout=float(section.heartbeat_timeout),
        )
