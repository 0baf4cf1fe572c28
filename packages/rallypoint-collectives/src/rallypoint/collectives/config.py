"""The ``[collectives]`` section of the job file, declared by this package.

``backend`` is a plain name (or ``"auto"``) here; core's resolution looks it up among the
collective backends (:data:`~rallypoint.collectives.records.COLLECTIVE_BACKENDS`) and validates
``[collectives.options]`` with the selected backend's ``options_model``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field

from rallypoint.collectives.env import BACKEND_ENV, OPTIONS_ENV, TIMEOUT_ENV
from rallypoint.core.config import ConfigSection, PositiveDuration, ResolvedConfig, Section

__all__ = ["COLLECTIVES_SECTION", "CollectivesSection", "worker_env"]


class CollectivesSection(Section):
    """``[collectives]``: the torch process-group backend for workers."""

    backend: str = Field(default="auto", description='Collective backend, or "auto" (picked in each worker).')
    timeout: PositiveDuration = Field(default=600.0, description="Default timeout of every collective call.")
    options: dict[str, Any] = Field(default_factory=dict, description="The backend's own options.")


def worker_env(resolved: ResolvedConfig, base: Path) -> dict[str, str]:
    """What the workers read of ``[collectives]`` (see :mod:`rallypoint.collectives.env`).

    ``RALLYPOINT_COLLECTIVES_OPTIONS`` holds the ``[collectives.options]`` that resolution
    validated with the backend's own model, as a JSON object (``{}`` when there are none).
    """
    del base
    section = resolved.section(CollectivesSection)
    selection = resolved.selection("collectives.backend")
    options = selection.options if selection is not None else None
    return {
        BACKEND_ENV: section.backend,
        TIMEOUT_ENV: f"{section.timeout:g}",
        OPTIONS_ENV: json.dumps(options.model_dump(mode="json") if options is not None else {}, separators=(",", ":")),
    }


#: The section as this package declares it (``rallypoint_config_sections``).
COLLECTIVES_SECTION = ConfigSection(
    "collectives", CollectivesSection, "the process-group backend of the workers", worker_env=worker_env
)
