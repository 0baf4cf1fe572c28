"""Durations as written in job files: "250ms", "30s", "5m", "1h30m" or numbers of seconds."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from rallypoint.core.config import Duration, format_duration, parse_duration

HINT = '(write e.g. "10m" or "30s")'


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("2d", 172800.0),
        ("1h30m", 5400.0),
        ("1m30s", 90.0),
        ("1h 30m", 5400.0),
        (" 5M ", 300.0),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("90", 90.0),
        ("0.25", 0.25),
        ("0s", 0.0),
        (30, 30.0),
        (2.5, 2.5),
        (0, 0.0),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["ten minutes", "", "5 minutes", "m", "5x", "30s5", "1h-30m", "-5s", "s30"])
def test_bad_duration_strings(bad: str) -> None:
    with pytest.raises(ValueError, match=r"^invalid duration") as info:
        parse_duration(bad)
    assert str(info.value) == f"invalid duration {bad!r} {HINT}"


@pytest.mark.parametrize("bad", [-1, -0.5, "-3", float("nan"), float("inf"), "inf", "nan"])
def test_negative_or_infinite_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="must be a finite, non-negative time") as info:
        parse_duration(bad)
    assert str(info.value) == f"invalid duration {bad!r}: must be a finite, non-negative time {HINT}"


@pytest.mark.parametrize("bad", [True, None, [30], {"s": 30}])
def test_non_durations(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^invalid duration") as info:
        parse_duration(bad)
    assert str(info.value) == f"invalid duration {bad!r} {HINT}"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.25, "250ms"),
        (0.1, "100ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (30, "30s"),
        (90, "1m30s"),
        (600, "10m"),
        (3600, "1h"),
        (5400, "1h30m"),
        (86400, "1d"),
        (90061, "25h1m1s"),  # days only for whole days
        (172800, "2d"),
        (129600, "36h"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0, 0.001, 0.25, 1, 1.5, 59, 61, 600, 5400, 86400, 90061, 129600, 3601.5])
def test_format_then_parse_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


class Timeouts(BaseModel):
    join: Duration = 600.0


def test_duration_field_parses_and_serialises_in_human_form() -> None:
    model = Timeouts.model_validate({"join": "1h30m"})

    assert model.join == 5400.0
    assert model.model_dump() == {"join": 5400.0}
    assert model.model_dump(mode="json") == {"join": "1h30m"}
    assert Timeouts().model_dump(mode="json") == {"join": "10m"}


def test_duration_field_error_message() -> None:
    with pytest.raises(ValidationError) as info:
        Timeouts.model_validate({"join": "soon"})
    [error] = info.value.errors()
    assert error["msg"] == f"invalid duration 'soon' {HINT}"
