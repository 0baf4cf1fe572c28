"""The rendezvous timeouts, as one typed object configured in one place.

The defaults live here, on :class:`RendezvousTimeouts`, and nowhere else: the ``[rendezvous]``
section of the job file takes its defaults from these fields, and the torch adapter falls back
on them for ``--rdzv-conf`` keys torchrun was not given. A timeout travels job file ->
``[rendezvous]`` section -> :meth:`RendezvousTimeouts.from_section` -> the handler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["RendezvousTimeouts", "TimeoutSettings"]


class TimeoutSettings(Protocol):
    """What :meth:`RendezvousTimeouts.from_section` reads: the ``[rendezvous]`` section's timeouts in seconds.

    :class:`rallypoint.rendezvous.config.RendezvousSection` has this shape; so may any object
    that carries validated timeouts (this module does not depend on the job file's model).
    """

    @property
    def join_timeout(self) -> float:
        """Seconds a node waits for a round to form."""
        ...

    @property
    def last_call_timeout(self) -> float:
        """Seconds a round stays open for more nodes once it has its minimum."""
        ...

    @property
    def close_timeout(self) -> float:
        """Seconds closing the rendezvous at the end of the job may take."""
        ...

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between two heartbeats of a node."""
        ...

    @property
    def heartbeat_timeout(self) -> float:
        """Seconds without a heartbeat after which a node is taken for dead."""
        ...


#: ``--rdzv-conf`` / options key of each field (the job file's names), for :meth:`RendezvousTimeouts.from_options`.
_KEYS = {
    "join": ("join_timeout",),
    "last_call": ("last_call_timeout",),
    "close": ("close_timeout",),
    "heartbeat_interval": ("heartbeat_interval", "keep_alive_interval"),
    "heartbeat_timeout": ("heartbeat_timeout",),
}


@dataclass(frozen=True)
class RendezvousTimeouts:
    """Every rendezvous timeout, in seconds. The field defaults are the job file's defaults.

    Attributes:
        join: how long :meth:`~rallypoint.rendezvous.handler.RendezvousHandler.next_rendezvous`
            waits for a round that includes this node (``join_timeout``).
        last_call: how long a round stays open after ``min`` nodes joined (it completes at once
            when ``max`` joined) (``last_call_timeout``).
        close: how long closing the rendezvous may take (``close_timeout``).
        heartbeat_interval: how often a node refreshes its heartbeat record.
        heartbeat_timeout: a peer whose heartbeat record has not changed for this long, measured
            on the observer's own monotonic clock, is dead.

    Raises:
        ValueError: a timeout is not positive (``last_call`` may be 0), or ``heartbeat_timeout``
            is not longer than ``heartbeat_interval``.
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
                raise ValueError(f"rendezvous {_KEYS[name][0]} must be positive, got {value!r}")
        if not self.last_call >= 0:
            raise ValueError(f"rendezvous last_call_timeout must be >= 0, got {self.last_call!r}")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ValueError(
                f"heartbeat_timeout ({self.heartbeat_timeout:g}s) must be longer than "
                f"heartbeat_interval ({self.heartbeat_interval:g}s)"
            )

    @classmethod
    def from_section(cls, section: TimeoutSettings) -> RendezvousTimeouts:
        """The timeouts of a validated ``[rendezvous]`` section (its values are already seconds)."""
        return cls(
            join=section.join_timeout,
            last_call=section.last_call_timeout,
            close=section.close_timeout,
            heartbeat_interval=section.heartbeat_interval,
            heartbeat_timeout=section.heartbeat_timeout,
        )

    @classmethod
    def from_options(cls, get: Callable[[str], Any], *, where: str = "rendezvous options") -> RendezvousTimeouts:
        """Timeouts from loose ``key -> value`` settings that no job file validated (torchrun's ``--rdzv-conf``).

        Args:
            get: returns the raw value of a key, or ``None`` when it is not set. Keys are the job
                file's (``join_timeout``, ``last_call_timeout``, ``close_timeout``,
                ``heartbeat_interval``, ``heartbeat_timeout``); ``keep_alive_interval`` (torch's
                name) is accepted for ``heartbeat_interval``. Values are durations (``30``,
                ``"30s"``, ``"5m"``); unset keys take the defaults.
            where: what the settings are, quoted in errors (``"--rdzv-conf"``).

        Raises:
            ValueError: a value is not a duration, or the timeouts are inconsistent; the message
                names the key and ``where``.
        """
        from rallypoint.core.config.durations import parse_duration

        values: dict[str, float] = {}
        for field_name, keys in _KEYS.items():
            for key in keys:
                raw = get(key)
                if raw is None:
                    continue
                try:
                    values[field_name] = parse_duration(raw)
                except ValueError as exc:
                    raise ValueError(f"{where}: {key}: {exc}") from None
                break
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
