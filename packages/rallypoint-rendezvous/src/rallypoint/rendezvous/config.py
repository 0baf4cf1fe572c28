"""The ``[rendezvous]`` section of the job file, declared by this package.

Its timeout defaults are those of :class:`~rallypoint.rendezvous.timeouts.RendezvousTimeouts`
(one place holds each default). ``backend`` is a plain name here; core's resolution looks it up
among the rendezvous backends (:data:`~rallypoint.rendezvous.records.RENDEZVOUS_BACKENDS`) and
validates ``options`` with the selected backend's ``options_model``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from rallypoint.core.config import ConfigSection, Duration, PositiveDuration, Section, format_duration
from rallypoint.core.config.sections import cross_field_error
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = [
    "MIN_HEARTBEAT_INTERVAL",
    "MIN_HEARTBEAT_TIMEOUT",
    "MAX_RUN_ID_LENGTH",
    "RENDEZVOUS_SECTION",
    "RUN_ID_PATTERN",
    "RUN_ID_RULE",
    "RendezvousSection",
    "check_run_id",
]

#: The longest run id.
MAX_RUN_ID_LENGTH = 128
#: A run id: ASCII letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit. It names
#: directories (logs, the file backend's state) and keys, so it can hold no ``/`` and cannot be ``..``.
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: The run id rule, in words (error messages).
RUN_ID_RULE = (
    f"a run id is 1 to {MAX_RUN_ID_LENGTH} ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"
)


def check_run_id(value: str) -> str:
    """Return ``value`` if it is a valid run id (see :data:`RUN_ID_PATTERN`).

    >>> check_run_id("exp-7.a_1")
    'exp-7.a_1'

    Raises:
        PydanticCustomError: the id is empty, too long or holds another character; the message
            says the rule (within a pydantic model it becomes a located config error).
    """
    if len(value) <= MAX_RUN_ID_LENGTH and RUN_ID_PATTERN.fullmatch(value):
        return value
    shown = repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    raise PydanticCustomError("run_id", "invalid run id {value}: {rule}", {"value": shown, "rule": RUN_ID_RULE})


_DEFAULTS = RendezvousTimeouts()
#: The shortest ``heartbeat_interval``: each beat is a write to the backend, by every node.
MIN_HEARTBEAT_INTERVAL = 0.1
#: The shortest ``heartbeat_timeout``: shorter, a node is taken for dead by a pause of its host (a
#: scheduler hiccup, a garbage collection) and every round ends in a re-rendezvous.
MIN_HEARTBEAT_TIMEOUT = 0.5


def _at_least(bound: float, why: str) -> Any:
    def check(seconds: float) -> float:
        if seconds < bound:
            raise PydanticCustomError(
                "duration_floor",
                "at least {bound}, got {value}: {why}",
                {"bound": format_duration(bound), "value": format_duration(seconds), "why": why},
            )
        return seconds

    return AfterValidator(check)


class RendezvousSection(Section):
    """``[rendezvous]``: how agents find each other. ``options`` belong to the backend."""

    backend: str = Field(default="memory", description="Rendezvous backend (memory, file, grpc, etcd...).")
    run_id: Annotated[str, AfterValidator(check_run_id)] | None = Field(
        default=None, description="Job identity shared by all agents; generated when standalone."
    )
    join_timeout: PositiveDuration = _DEFAULTS.join
    last_call_timeout: Duration = _DEFAULTS.last_call
    close_timeout: PositiveDuration = _DEFAULTS.close
    heartbeat_interval: Annotated[
        PositiveDuration,
        _at_least(MIN_HEARTBEAT_INTERVAL, "every node writes to the backend each interval (default 2s)"),
    ] = _DEFAULTS.heartbeat_interval
    heartbeat_timeout: Annotated[
        PositiveDuration,
        _at_least(MIN_HEARTBEAT_TIMEOUT, "a shorter pause of a node's host would take it for dead (default 10s)"),
    ] = _DEFAULTS.heartbeat_timeout
    options: dict[str, Any] = Field(default_factory=dict, description="The backend's own options.")

    @model_validator(mode="after")
    def _heartbeats(self) -> RendezvousSection:
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise cross_field_error(
                "heartbeat",
                "heartbeat_timeout ({timeout}) must be longer than heartbeat_interval ({interval})",
                ("heartbeat_timeout", "heartbeat_interval"),
                timeout=format_duration(self.heartbeat_timeout),
                interval=format_duration(self.heartbeat_interval),
            )
        return self


#: The section as this package declares it (``rallypoint_config_sections``).
RENDEZVOUS_SECTION = ConfigSection("rendezvous", RendezvousSection, "how agents find each other")
