"""The ``[debug]`` section of the job file: hang forensics the agent does on its own (issue #40).

``hang_timeout``: when the workers of a node make no progress for that long (no collective
completes, no timeline event is written), the agent gathers the hang report from every node and
fails the attempt (:mod:`rallypoint.agent.hang_watch`). Off by default: a job that legitimately
goes quiet (a long evaluation without collectives, a checkpoint) must choose a timeout longer
than its quietest stretch.

``RALLYPOINT_DEBUG=1`` (core's traceback switch) is no key of this section: a variable without a
key is never configuration, so ``RALLYPOINT_DEBUG_HANG_TIMEOUT`` sets the timeout and
``RALLYPOINT_DEBUG`` still only shows tracebacks.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema
from pydantic_core import PydanticCustomError

from rallypoint.core.config import ConfigSection, Section, format_duration, parse_duration
from rallypoint.core.config.durations import duration_json_schema

__all__ = ["DEBUG_SECTION", "MIN_HANG_TIMEOUT", "DebugSection", "HangTimeout"]

#: The shortest ``hang_timeout``: a shorter one takes one slow step for a hang.
MIN_HANG_TIMEOUT = 1.0


def _hang_timeout(value: Any) -> float:
    if isinstance(value, str) and value.strip().lower() == "off":
        return 0.0
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise PydanticCustomError(
            "hang_timeout", '{problem}; or "off" (the default) for no hang detection', {"problem": str(exc)}
        ) from None
    if 0 < seconds < MIN_HANG_TIMEOUT:
        raise PydanticCustomError(
            "hang_timeout",
            'at least {least}, got {value}: a shorter time takes one slow step for a hang; "off" (or 0) turns it off',
            {"least": format_duration(MIN_HANG_TIMEOUT), "value": format_duration(seconds)},
        )
    return seconds


_SCHEMA = {
    "anyOf": [
        {**duration_json_schema(positive=True)["anyOf"][0], "minimum": MIN_HANG_TIMEOUT},
        duration_json_schema(positive=True)["anyOf"][1],
        {"const": 0},
        {"const": "off"},
    ],
    "description": 'a duration of at least 1s (e.g. "10m"), or "off" (also 0)',
}

#: Seconds, at least :data:`MIN_HANG_TIMEOUT`; ``0.0`` for off (written ``"off"`` or ``0``).
HangTimeout = Annotated[
    float,
    BeforeValidator(_hang_timeout),
    PlainSerializer(lambda v: format_duration(v) if v else "off", return_type=str),
    WithJsonSchema(_SCHEMA, mode="validation"),
]


class DebugSection(Section):
    """``[debug]``: hang forensics the agent does on its own."""

    hang_timeout: HangTimeout = Field(
        default=0.0,
        description="Fail the attempt, with the hang report of every node, when a node's workers make no progress "
        '(no collective completes, no timeline event) for this long; "off" (the default) or 0: never.',
    )


DEBUG_SECTION = ConfigSection("debug", DebugSection, "hang forensics: fail a job that makes no progress")
