"""The ``none`` launch environment: nothing is detected or filled in (flags and the job file only)."""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.agent.launch.facts import LaunchFacts

__all__ = ["detect"]


def detect(environ: Mapping[str, str]) -> LaunchFacts | None:
    """Always ``None``: the agent takes nothing from its environment."""
    return None
