"""Core's defences against hostile job input: size, devices, depth, huge numbers, durations, and blame.

Issue #12: each of these used to end in "internal error ... this is a bug" (RecursionError,
MemoryError, ValueError, OverflowError) or credit the wrong source. Core alone: the sections are
made up here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import Field, model_validator

from rallypoint.core.config import ConfigSection, Duration, Section, build_schema, load_job_config, parse_duration
from rallypoint.core.config.durations import MAX_DURATION
from rallypoint.core.config.loader import MAX_DEPTH, MAX_FILE_BYTES, env_overrides, parse_value
from rallypoint.core.config.sections import cross_field_error
from rallypoint.core.errors import ConfigError


class SpanSection(Section):
    low: int = 0
    high: int = 10
    wait: Duration = 1.0
    extra: dict[str, object] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _order(self) -> SpanSection:
        if self.high < self.low:
            raise cross_field_error(
                "span", "high ({high}) is below low ({low})", ("high", "low"), high=self.high, low=self.low
            )
        return self


SCHEMA = build_schema([ConfigSection("span", SpanSection)])


def load_error(path: str | os.PathLike[str] | None, **kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_job_config(path, SCHEMA, **kwargs)  # type: ignore[arg-type]
    assert info.value.exit_code == 2
    return info.value


def test_a_symlink_to_dev_zero_is_refused_without_reading_it(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.symlink_to("/dev/zero")
    issue = load_error(job, environ={}).issues[0]
    assert (issue.source, issue.key) == (str(job), "")
    assert "is a device or socket" in issue.message


def test_a_file_larger_than_the_cap_is_refused_and_the_cap_is_said(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("# x\n" * (MAX_FILE_BYTES // 4 + 1))
    assert str(load_error(job, environ={})) == (
        f"{job}: is larger than 1024 KiB, the most a job file may hold; is it the right file?"
    )


def test_a_file_at_the_cap_is_read(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[span]\nlow = 1\n" + "#" * (MAX_FILE_BYTES - len("[span]\nlow = 1\n")))
    assert job.stat().st_size == MAX_FILE_BYTES
    assert load_job_config(job, SCHEMA, environ={}).config.span.low == 1


def test_a_600_deep_inline_table_is_a_located_error(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[span]\nextra = " + "{a = " * 600 + "1" + "}" * 600 + "\n")
    assert str(load_error(job, environ={})) == (
        f"{job}: tables and lists nest more than {MAX_DEPTH} levels deep (the most a job accepts); flatten the value"
    )


def test_nesting_just_past_the_cap_names_the_key(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[span]\nextra = " + "{a = " * MAX_DEPTH + "1" + "}" * MAX_DEPTH + "\n")
    issue = load_error(job, environ={}).issues[0]
    assert issue.key == "span.extra" + ".a" * (MAX_DEPTH - 2)


def test_nesting_up_to_the_cap_is_accepted(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    depth = MAX_DEPTH - 2  # the file's [span] table and the extra table are two levels
    job.write_text("[span]\nextra = " + "{a = " * depth + "1" + "}" * depth + "\n")
    assert load_job_config(job, SCHEMA, environ={}).config.span.extra


def test_deep_values_from_variables_and_set_are_refused() -> None:
    deep = "[" * 700 + "]" * 700
    with pytest.raises(ValueError, match="nest more than 32 levels"):
        parse_value(deep)
    with pytest.raises(ConfigError) as info:
        env_overrides({"RALLYPOINT_SPAN_EXTRA": deep}, ["span"])
    assert (info.value.issues[0].source, info.value.issues[0].key) == (
        "RALLYPOINT_SPAN_EXTRA (environment)",
        "span.extra",
    )


def test_an_integer_of_5000_digits_is_a_located_error(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[span]\nlow = " + "9" * 5000 + "\n")
    assert "holds an integer of more than 4300 digits" in str(load_error(job, environ={}))
    assert parse_value("9" * 5000) == "9" * 5000  # a plain string, refused by the section that reads it


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (10**400, "a 401-digit number"),
        ("400d", "at most 365d"),
        (1e300, "at most 365d"),
        ("9" * 100, "too long to be a time"),
    ],
)
def test_durations_are_bounded(value: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_duration(value)


def test_the_longest_duration_is_accepted() -> None:
    assert parse_duration("365d") == MAX_DURATION


def test_a_cross_key_error_blames_the_key_that_was_set(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[span]\nlow = 5\n")
    issue = load_error(job, environ={"RALLYPOINT_SPAN_HIGH": "1"}).issues[0]
    assert str(issue) == (
        f"RALLYPOINT_SPAN_HIGH (environment): span.high: high (1) is below low (5) (span.low from {job})"
    )


def test_a_cross_key_error_never_blames_a_default(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[span]\nwait = 2\n")  # the section is in the file, its low is not
    issue = load_error(job, environ={}, overrides=[("span.low", 50, "--low (command line)")]).issues[0]
    assert str(issue) == "--low (command line): span.low: high (10) is below low (50) (span.high is the default)"


def test_a_value_set_below_a_key_is_credited_to_who_set_it() -> None:
    issue = load_error(None, environ={}, overrides=[("span.low.x", 1, "--set span.low.x (command line)")]).issues[0]
    assert (issue.source, issue.key) == ("--set span.low.x (command line)", "span.low")
