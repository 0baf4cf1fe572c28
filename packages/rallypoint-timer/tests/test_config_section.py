"""The ``[timer]`` section and the timer-backend kind this package declares (moved from core)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.core.config import build_schema, load_job_config, resolve_config
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import get_plugin_manager
from rallypoint.timer.config import TIMER_SECTION, TimerSection
from rallypoint.timer.options import FileOptions
from rallypoint.timer.records import TIMER_BACKENDS

SCHEMA = build_schema([TIMER_SECTION])


def test_the_package_declares_its_kind_and_section() -> None:
    pm = get_plugin_manager(autoload=False)

    assert pm.kind("rallypoint_timer_backends") is TIMER_BACKENDS
    assert TIMER_BACKENDS.config_key == "timer.watchdog"
    assert TIMER_SECTION in pm.sections()
    assert pm.infos["timer"].essential is True
    assert pm.registry(TIMER_BACKENDS).names() == ["file", "local"]


def test_defaults_and_the_file(tmp_path: Path) -> None:
    assert load_job_config(None, SCHEMA, environ={}).section(TimerSection).model_dump() == {
        "watchdog": "off",
        "timeline": False,
        "timeline_config": None,
        "options": {},
    }
    (tmp_path / "job.toml").write_text('[timer]\nwatchdog = "file"\ntimeline = true\ntimeline_config = "tl.json"\n')
    timer = load_job_config(tmp_path / "job.toml", SCHEMA, environ={}).config.timer
    assert (timer.watchdog, timer.timeline, timer.timeline_config) == ("file", True, "tl.json")
    env = load_job_config(None, SCHEMA, environ={"RALLYPOINT_TIMER_TIMELINE": "true"}).config.timer
    assert env.timeline is True


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[timer]\ntimeline = 3\n", "job.toml: timer.timeline: expected true or false, got 3"),
        ('[timer]\ntimeline = "yes"\n', "job.toml: timer.timeline: expected true or false, got 'yes'"),
    ],
)
def test_structure_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.toml").write_text(toml)

    with pytest.raises(ConfigError) as info:
        load_job_config("job.toml", SCHEMA, environ={})

    assert str(info.value) == message


def test_off_disables_the_watchdog_and_a_backend_gets_its_options_validated_once() -> None:
    pm = get_plugin_manager(environ={})
    off = resolve_config(load_job_config(None, pm, environ={}), pm).selection("timer.watchdog")
    assert off is not None
    assert (off.name, off.record, off.note) == ("off", None, "disabled")

    environ = {"RALLYPOINT_TIMER_WATCHDOG": "file", "RALLYPOINT_TIMER_OPTIONS_GC_INTERVAL": "2.5"}
    chosen = resolve_config(load_job_config(None, pm, environ=environ), pm).selection("timer.watchdog")
    assert chosen is not None
    assert chosen.record is not None
    assert chosen.record.name == "file"
    assert chosen.options == FileOptions(gc_interval=2.5)
