"""Shared fixtures of the rallypoint-ranks tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from rallypoint.agent.records import RANK_STRATEGIES
from rallypoint.core.config import load_job_config, resolve_config
from rallypoint.core.plugins import RallypointPluginManager, get_plugin_manager

#: ``resolve_options(strategy, options, pm=None)``: the validated ``[ranks.options]`` of a job.
ResolveOptions = Callable[..., BaseModel | None]


@pytest.fixture
def registry() -> Any:
    """The rank-strategy registry of a fresh manager with every installed plugin."""
    return get_plugin_manager(autoload=True).registry(RANK_STRATEGIES)


def _resolve_options(
    strategy: str, options: dict[str, Any], pm: RallypointPluginManager | None = None
) -> BaseModel | None:
    pm = pm or get_plugin_manager(autoload=True)
    loaded = load_job_config(
        None,
        pm,
        environ={},
        overrides=[
            ("job.entrypoint", "train.py", "test"),
            ("ranks.strategy", strategy, "test"),
            ("ranks.options", options, "test"),
        ],
    )
    selection = resolve_config(loaded, pm).selection("ranks.strategy")
    assert selection is not None
    return selection.options


@pytest.fixture
def resolve_options() -> ResolveOptions:
    """Validate ``[ranks.options]`` the one way jobs do: core's config resolution of a job selecting the strategy.

    Raises ``ConfigError`` for invalid options, as ``rallypoint config check`` does.
    """
    return _resolve_options
