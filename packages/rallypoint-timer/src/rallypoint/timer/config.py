"""The ``[timer]`` section of the job file, declared by this package.

``watchdog`` is a plain name (or ``"off"``) here; core's resolution looks it up among the timer
backends (:data:`~rallypoint.timer.records.TIMER_BACKENDS`) and validates ``[timer.options]``
with the selected backend's ``options_model``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rallypoint.core.config import ConfigSection, Section

__all__ = ["TIMER_SECTION", "TimerSection"]


class TimerSection(Section):
    """``[timer]``: watchdog timers and the event timeline."""

    watchdog: str = Field(default="off", description='Watchdog backend (local, file), or "off".')
    timeline: bool = Field(default=False, description="Record every worker's event timeline.")
    timeline_config: str | None = Field(
        default=None,
        description=(
            "A JSON timeline config file (which events, flush interval, CUDA spans), relative to the "
            "job file; workers get it as RALLYPOINT_TIMELINE_CONFIG (rallypoint.timer.TimelineClient reads it)."
        ),
    )
    options: dict[str, Any] = Field(default_factory=dict, description="The watchdog backend's own options.")


#: The section as this package declares it (``rallypoint_config_sections``).
TIMER_SECTION = ConfigSection("timer", TimerSection, "watchdog timers and the event timeline")
