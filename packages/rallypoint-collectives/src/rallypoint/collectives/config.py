"""The ``[collectives]`` section of the job file, declared by this package.

``backend`` is a plain name (or ``"auto"``) here; core's resolution looks it up among the
collective backends (:data:`~rallypoint.collectives.records.COLLECTIVE_BACKENDS`) and validates
``[collectives.options]`` with the selected backend's ``options_model``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rallypoint.core.config import ConfigSection, PositiveDuration, Section

__all__ = ["COLLECTIVES_SECTION", "CollectivesSection"]


class CollectivesSection(Section):
    """``[collectives]``: the torch process-group backend for workers."""

    backend: str = Field(default="auto", description='Collective backend, or "auto" (picked in each worker).')
    timeout: PositiveDuration = Field(default=600.0, description="Default timeout of every collective call.")
    options: dict[str, Any] = Field(default_factory=dict, description="The backend's own options.")


#: The section as this package declares it (``rallypoint_config_sections``).
COLLECTIVES_SECTION = ConfigSection("collectives", CollectivesSection, "the process-group backend of the workers")
