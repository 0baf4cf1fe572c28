"""Durations in the job file: ``"250ms"``, ``"30s"``, ``"5m"``, ``"1h30m"`` or a number of seconds."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema
from pydantic_core import PydanticCustomError

__all__ = [
    "DURATION_PATTERN",
    "MAX_DURATION",
    "Duration",
    "PositiveDuration",
    "duration_json_schema",
    "format_duration",
    "parse_duration",
]

#: The longest duration a job accepts, in seconds (365 days): longer waits are mistakes, and
#: timeouts past the platform's limit (``threading.TIMEOUT_MAX``) would fail at run time.
MAX_DURATION = 365 * 86400.0

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d)")
_WHOLE = re.compile(r"^\s*(?:(?:\d+(?:\.\d+)?|\.\d+)\s*(?:ms|s|m|h|d)\s*)+$")
_NUMBER = re.compile(r"^\s*\+?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?\s*$")
_HINT = 'write e.g. "10m" or "30s"'


def parse_duration(value: Any) -> float:
    """Parse a duration into seconds.

    Accepts a non-negative number of seconds, a numeric string, or units ``ms``, ``s``, ``m``,
    ``h``, ``d``, optionally combined (``"1m30s"``); at most :data:`MAX_DURATION` (``"365d"``).

    >>> parse_duration("250ms"), parse_duration("5m"), parse_duration("1h30m"), parse_duration(2)
    (0.25, 300.0, 5400.0, 2.0)

    Raises:
        ValueError: the value is not a duration; the message says how to write one.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r} ({_HINT})")
    if isinstance(value, int) and value > MAX_DURATION:
        raise ValueError(f"invalid duration {_short(value)}: at most 365d ({_HINT})")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if len(text) > 64:
            raise ValueError(f"invalid duration {_short(value)}: too long to be a time ({_HINT})")
        if _NUMBER.match(text):
            seconds = float(text)
        elif _WHOLE.match(text):
            seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
        else:
            try:
                seconds = float(text)  # "-3", "inf", "nan": refused below with the reason
            except ValueError:
                seconds = 0.0
            if not (math.isnan(seconds) or math.isinf(seconds) or seconds < 0):  # "1_000", "0x10"
                raise ValueError(f"invalid duration {value!r} ({_HINT})")
    else:
        raise ValueError(f"invalid duration {value!r} ({_HINT})")
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {value!r}: must be a finite, non-negative time ({_HINT})")
    if seconds > MAX_DURATION:
        raise ValueError(f"invalid duration {value!r}: at most 365d ({_HINT})")
    return seconds


def _short(value: Any) -> str:
    """``repr(value)``, cut to a readable length (hostile values can be huge)."""
    text = repr(value) if not isinstance(value, int) or value < 10**40 else f"a {len(str(value))}-digit number"
    return text if len(text) <= 40 else text[:37] + "..."


def format_duration(seconds: float) -> str:
    """Write seconds the way a person would in the job file.

    >>> format_duration(0.25), format_duration(30), format_duration(600), format_duration(5400)
    ('250ms', '30s', '10m', '1h30m')
    """
    if seconds == 0:
        return "0s"
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:g}ms"
    out = []
    rest = seconds
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if rest >= size and (rest % size == 0 or unit != "d"):
            count = int(rest // size)
            if count:
                out.append(f"{count}{unit}")
                rest -= count * size
    if rest:
        out.append(f"{rest:g}s")
    return "".join(out)


def _validate(value: Any) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise PydanticCustomError("duration", str(exc)) from None


def _ci(text: str) -> str:
    """A regular expression matching ``text`` in any letter case (JSON Schema patterns have no flags)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in text)


_UNIT = "(?:" + "|".join(_ci(unit) for unit in ("ms", "s", "m", "h", "d")) + ")"
_DECIMAL = r"(?:\d+(?:\.\d+)?|\.\d+)"
#: The strings :func:`parse_duration` reads, as an ECMA-262 pattern (the JSON Schema dialect):
#: a number of seconds (``"30"``, ``"1.5e3"``) or unit parts (``"1h30m"``). Surrounding blanks are
#: allowed, as the parser strips them.
DURATION_PATTERN = (
    r"^\s*(?:\+?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
    rf"|(?:{_DECIMAL}\s*{_UNIT}\s*)+)\s*$"
)


def duration_json_schema(*, positive: bool) -> dict[str, Any]:
    """The JSON Schema of a duration: a number of seconds or a duration string.

    What the schema cannot say: a string's value must be at most 365 days (the number branch
    says it). A positive duration's string must hold a digit other than 0 (a zero time is
    written with zeros only).

    Examples:
        >>> duration_json_schema(positive=True)["anyOf"][0]
        {'type': 'number', 'exclusiveMinimum': 0, 'maximum': 31536000.0}
    """
    number: dict[str, Any] = {"type": "number"}
    number["exclusiveMinimum" if positive else "minimum"] = 0
    number["maximum"] = MAX_DURATION
    pattern = DURATION_PATTERN if not positive else "^(?=.*[1-9])" + DURATION_PATTERN[1:]
    text = {"type": "string", "pattern": pattern, "maxLength": 64}
    return {
        "anyOf": [number, text],
        "description": 'a number of seconds or a duration such as "250ms", "30s", "10m", "1h30m"',
    }


#: A pydantic field type: seconds as ``float``, parsed from any accepted duration form and
#: serialised back in human form.
Duration = Annotated[
    float,
    BeforeValidator(_validate),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema(duration_json_schema(positive=False), mode="validation"),
]

#: A :data:`Duration` that must be greater than zero (a timeout, an interval).
PositiveDuration = Annotated[
    Duration,
    Field(gt=0),
    WithJsonSchema(duration_json_schema(positive=True), mode="validation"),
]
