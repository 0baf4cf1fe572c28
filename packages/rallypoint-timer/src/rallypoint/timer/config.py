"""The ``[timer]`` section of the job file, declared by this package.

``watchdog`` is a plain name (or ``"off"``) here; core's resolution looks it up among the timer
backends (:data:`~rallypoint.timer.records.TIMER_BACKENDS`) and validates ``[timer.options]``
with the selected backend's ``options_model``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from rallypoint.core.config import ConfigSection, ProgressFile, ResolvedConfig, Section
from rallypoint.timer.timeline import ENV_CONFIG, ENV_FILE

__all__ = ["TIMER_SECTION", "TimerSection", "worker_env"]


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


def worker_env(resolved: ResolvedConfig, base: Path) -> dict[str, str]:
    """The timeline's worker variables.

    ``RALLYPOINT_TIMELINE_FILE`` with ``timeline`` (one log per worker, under the attempt's
    directory: filled in by the agent) and ``RALLYPOINT_TIMELINE_CONFIG`` (the config file, absolute).
    """
    section = resolved.section(TimerSection)
    env: dict[str, str] = {}
    if section.timeline:
        env[ENV_FILE] = ProgressFile("{attempt_dir}/timeline/rank_{rank}.jsonl")
    if section.timeline_config:
        env[ENV_CONFIG] = str(base / section.timeline_config)
    return env


#: The section as this package declares it (``rallypoint_config_sections``).
TIMER_SECTION = ConfigSection("timer", TimerSection, "watchdog timers and the event timeline", worker_env=worker_env)
