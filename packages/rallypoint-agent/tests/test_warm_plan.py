"""``[agent] preload`` in the job file, the variables and planning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent.plan import NodeFacts, plan_job
from rallypoint.core.config import load_job_config, resolve_config
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import RallypointPluginManager, get_plugin_manager


@pytest.fixture(scope="module")
def pm() -> RallypointPluginManager:
    return get_plugin_manager()


def plan(pm: RallypointPluginManager, tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Any:
    (tmp_path / "train.py").write_text("pass\n")
    path = tmp_path / "job.toml"
    path.write_text(text)
    resolved = resolve_config(load_job_config(path, pm, environ=environ or {}), pm)
    facts = NodeFacts(host="h", pid=1, environ={"PATH": "/bin"}, cwd=tmp_path, job_file=path, executable="/py")
    return plan_job(resolved, facts)


def test_preload_from_the_job_file_reaches_the_agent_with_the_shared_environment(
    pm: RallypointPluginManager, tmp_path: Path
) -> None:
    text = '[job]\nentrypoint = "train.py"\n[job.env]\nX = "1"\n[nodes]\nnproc_per_node = 2\n'
    settings = plan(pm, tmp_path, text + '[agent]\npreload = ["torch", "numpy.linalg"]\n').settings
    assert settings.preload == ("torch", "numpy.linalg")
    assert settings.preload_env is not None
    assert settings.preload_env["X"] == "1"
    assert settings.preload_env["PATH"] == "/bin"
    assert settings.preload_env["OMP_NUM_THREADS"] == "1"  # read as libraries load: set before the imports
    plain = plan(pm, tmp_path, text).settings
    assert plain.preload == ()
    assert plain.preload_env is None


def test_preload_from_a_variable_is_a_comma_separated_list(pm: RallypointPluginManager, tmp_path: Path) -> None:
    settings = plan(pm, tmp_path, '[job]\nentrypoint = "train.py"\n', {"RALLYPOINT_AGENT_PRELOAD": "torch, numpy"})
    assert settings.settings.preload == ("torch", "numpy")


def test_a_bad_module_name_is_a_config_error_naming_the_key(pm: RallypointPluginManager, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        plan(pm, tmp_path, '[job]\nentrypoint = "train.py"\n[agent]\npreload = ["torch", "not a module"]\n')
    assert "agent.preload" in str(info.value)
    assert "is not a module name" in str(info.value)


def test_preloading_for_a_program_that_is_not_python_is_refused(pm: RallypointPluginManager, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        plan(pm, tmp_path, '[job]\nentrypoint = "/bin/true"\n[agent]\npreload = ["torch"]\n')
    assert info.value.exit_code == 2
    assert "agent.preload" in str(info.value)
    assert "'/bin/true' as a program" in str(info.value)
