"""Show core's tests an environment holding rallypoint-core alone (plus the test's own fakes).

The workspace environment has every rallypoint package installed; core's tests must behave as
they do where ``pip install rallypoint-core`` is all there is. This module hides, from
``importlib.metadata.entry_points``, the entry points of every ``rallypoint*`` distribution but
``rallypoint-core`` itself, and of the distributions named in ``RP_TEST_HIDDEN_DISTS``
(comma-separated). In a subprocess it is imported as ``sitecustomize`` (its directory is put on
``PYTHONPATH``) and patches at start-up; in the test process the conftest applies
:func:`filtered` with ``monkeypatch`` instead. In a venv holding core alone it hides nothing.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable, Iterable
from typing import Any

HIDDEN_ENV = "RP_TEST_HIDDEN_DISTS"


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


def visible(ep: importlib.metadata.EntryPoint, hidden: Iterable[str]) -> bool:
    """Whether core's tests may see ``ep``."""
    name = _normal(ep.dist.name) if ep.dist is not None else ""
    if name in {_normal(h) for h in hidden}:
        return False
    return name == "rallypoint-core" or not name.startswith("rallypoint")


def filtered(real: Callable[..., Any], hidden: Iterable[str]) -> Callable[..., Any]:
    """``importlib.metadata.entry_points`` that leaves out what :func:`visible` refuses."""

    def entry_points(**params: Any) -> Any:
        found = real(**params)
        if "group" not in params:
            return found
        return importlib.metadata.EntryPoints(ep for ep in found if visible(ep, hidden))

    return entry_points


if __name__ == "sitecustomize":
    _hidden = [n for n in os.environ.get(HIDDEN_ENV, "").split(",") if n]
    importlib.metadata.entry_points = filtered(importlib.metadata.entry_points, _hidden)
