"""The ``[collectives]`` section and the collective-backend kind this package declares (moved from core)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.collectives.config import COLLECTIVES_SECTION, CollectivesSection
from rallypoint.collectives.records import COLLECTIVE_BACKENDS
from rallypoint.core.config import build_schema, load_job_config, resolve_config
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import get_plugin_manager

SCHEMA = build_schema([COLLECTIVES_SECTION])


def test_the_package_declares_its_kind_and_section() -> None:
    pm = get_plugin_manager(autoload=False)

    assert pm.kind("rallypoint_collective_backends") is COLLECTIVE_BACKENDS
    assert COLLECTIVE_BACKENDS.config_key == "collectives.backend"
    auto = COLLECTIVE_BACKENDS.special_value("auto")
    assert auto is not None
    assert auto.needs_plugin is True
    assert COLLECTIVES_SECTION in pm.sections()
    assert pm.infos["collectives"].essential is True


def test_defaults() -> None:
    section = load_job_config(None, SCHEMA, environ={}).section(CollectivesSection)

    assert (section.backend, section.timeout, section.options) == ("auto", 600.0, {})


@pytest.mark.parametrize(("value", "seconds"), [('"250ms"', 0.25), ('"1h30m"', 5400.0), ("45", 45.0), ("0.5", 0.5)])
def test_durations_in_the_file(tmp_path: Path, value: str, seconds: float) -> None:
    (tmp_path / "job.toml").write_text(f'[collectives]\nbackend = "gloo"\ntimeout = {value}\n')

    section = load_job_config(tmp_path / "job.toml", SCHEMA, environ={}).config.collectives

    assert (section.backend, section.timeout) == ("gloo", seconds)


def test_auto_is_picked_at_run_time_among_the_installed_backends() -> None:
    pm = get_plugin_manager(environ={})
    loaded = load_job_config(None, pm, environ={}, overrides=[("job.entrypoint", "train.py", "test")])

    selection = resolve_config(loaded, pm).selection("collectives.backend")

    assert selection is not None
    assert selection.record is None
    names = pm.registry(COLLECTIVE_BACKENDS).names()
    assert {"gloo", "nccl"} <= set(names)
    assert selection.note == f"picked at run time among: {', '.join(names)}"


def test_auto_with_no_collective_backend_installed_says_what_to_install() -> None:
    pm = get_plugin_manager(environ={}, disabled=["gloo", "nccl"])
    loaded = load_job_config(None, pm, environ={"RALLYPOINT_COLLECTIVES_BACKEND": "auto"})

    with pytest.raises(ConfigError) as info:
        resolve_config(loaded, pm)

    assert (
        "RALLYPOINT_COLLECTIVES_BACKEND (environment): collectives.backend: 'auto' needs at least one collective "
        "backend, and none is installed; pip install rallypoint-gloo"
    ) in str(info.value).splitlines()
