"""What a declared section takes from the environment a command runs in (``ConfigSection.from_environment``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rallypoint.core.config import ConfigSection, Section, build_schema, load_in_environment
from rallypoint.core.errors import PluginError


class WidgetSection(Section):
    count: int = 1
    site: str = "here"


def from_cluster(loaded: Any, pm: Any, environ: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    if "CLUSTER_SIZE" not in environ:
        return []
    return [("widgets.count", int(environ["CLUSTER_SIZE"]), "cluster (CLUSTER_SIZE)"), ("widgets.site", "c", "cl")]


SCHEMA = build_schema([ConfigSection("widgets", WidgetSection, from_environment=from_cluster)])


def test_the_environment_fills_in_defaults_with_its_label() -> None:
    loaded = load_in_environment(None, SCHEMA, environ={"CLUSTER_SIZE": "4"})
    assert (loaded.config.widgets.count, loaded.source_of("widgets.count")) == (4, "cluster (CLUSTER_SIZE)")
    assert load_in_environment(None, SCHEMA, environ={}).source_of("widgets.count") == "default"


def test_the_file_variables_and_flags_win(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[widgets]\ncount = 2\n")
    env = {"CLUSTER_SIZE": "4", "RALLYPOINT_WIDGETS_SITE": "there"}
    loaded = load_in_environment(job, SCHEMA, environ=env)
    assert (loaded.config.widgets.count, loaded.source_of("widgets.count")) == (2, str(job))
    assert loaded.source_of("widgets.site") == "RALLYPOINT_WIDGETS_SITE (environment)"
    flagged = load_in_environment(None, SCHEMA, environ=env, overrides=[("widgets.count", 9, "--count (command line)")])
    assert (flagged.config.widgets.count, flagged.source_of("widgets.count")) == (9, "--count (command line)")


def test_from_environment_must_be_callable_or_an_import_path() -> None:
    with pytest.raises(PluginError, match="from_environment"):
        ConfigSection("widgets", WidgetSection, from_environment="no_colon_here")
    assert ConfigSection("widgets", WidgetSection, from_environment="pkg.mod:fill").from_environment == "pkg.mod:fill"
