"""Shared fixtures of the rallypoint-ranks tests."""

from __future__ import annotations

from typing import Any

import pytest

from rallypoint.core.plugins import get_plugin_manager
from rallypoint.core.registry import RANK_STRATEGIES


@pytest.fixture
def registry() -> Any:
    """The rank-strategy registry of a fresh manager with every installed plugin."""
    return get_plugin_manager(autoload=True).registry(RANK_STRATEGIES)
