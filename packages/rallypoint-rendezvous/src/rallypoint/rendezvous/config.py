"""The ``[rendezvous]`` section of the job file, declared by this package.

Its timeout defaults are those of :class:`~rallypoint.rendezvous.timeouts.RendezvousTimeouts`
(one place holds each default). ``backend`` is a plain name here; core's resolution looks it up
among the rendezvous backends (:data:`~rallypoint.rendezvous.records.RENDEZVOUS_BACKENDS`) and
validates ``options`` with the selected backend's ``options_model``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from rallypoint.core.config import ConfigSection, Duration, PositiveDuration, Section, format_duration
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = ["RENDEZVOUS_SECTION", "RendezvousSection"]

_DEFAULTS = RendezvousTimeouts()


class RendezvousSection(Section):
    """``[rendezvous]``: how agents find each other. ``options`` belong to the backend."""

    backend: str = Field(default="memory", description="Rendezvous backend (memory, file, grpc, etcd...).")
    run_id: str | None = Field(
        default=None, description="Job identity shared by all agents; generated when standalone."
    )
    join_timeout: PositiveDuration = _DEFAULTS.join
    last_call_timeout: Duration = _DEFAULTS.last_call
    close_timeout: PositiveDuration = _DEFAULTS.close
    heartbeat_interval: PositiveDuration = _DEFAULTS.heartbeat_interval
    heartbeat_timeout: PositiveDuration = _DEFAULTS.heartbeat_timeout
    options: dict[str, Any] = Field(default_factory=dict, description="The backend's own options.")

    @model_validator(mode="after")
    def _heartbeats(self) -> RendezvousSection:
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise PydanticCustomError(
                "heartbeat",
                "heartbeat_timeout ({timeout}) must be longer than heartbeat_interval ({interval})",
                {
                    "timeout": format_duration(self.heartbeat_timeout),
                    "interval": format_duration(self.heartbeat_interval),
                },
            )
        return self


#: The section as this package declares it (``rallypoint_config_sections``).
RENDEZVOUS_SECTION = ConfigSection("rendezvous", RendezvousSection, "how agents find each other")
