"""Choosing the collective backend: a name from config, or ``auto``.

Backends are registered through the ``rallypoint_collective_backends`` hook. Availability checks
may import torch, so they run only for the backends actually considered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rallypoint.collectives.errors import BackendUnavailableError
from rallypoint.collectives.records import Availability, CollectiveBackendRecord
from rallypoint.core.records import normalize_name

if TYPE_CHECKING:
    from rallypoint.core.plugins import RallypointPluginManager
    from rallypoint.core.registry import Registry

__all__ = ["Selection", "backends_by_torch_name", "select_backend"]

log = logging.getLogger("rallypoint.collectives")


@dataclass(frozen=True)
class Selection:
    """The backend chosen and why.

    Attributes:
        record: the chosen backend's record.
        requested: the name asked for (``"auto"`` or a backend name).
        reason: one sentence for the log, e.g. ``"auto: nccl unavailable (no CUDA device is
            visible); gloo: Gloo is compiled into this torch build"``.
    """

    record: CollectiveBackendRecord
    requested: str
    reason: str


def select_backend(
    name: str,
    *,
    plugin_manager: RallypointPluginManager | None = None,
    where: str = "collectives.backend",
) -> Selection:
    """Pick the collective backend called ``name``, or the best available one for ``"auto"``.

    ``auto`` considers the registered backends by descending priority (NCCL before Gloo) and
    takes the first whose availability check passes.

    Args:
        name: a backend name or ``"auto"``.
        plugin_manager: where the backends are registered (default: a fresh
            :func:`~rallypoint.core.plugins.get_plugin_manager`).
        where: where ``name`` came from, quoted in errors.

    Raises:
        UnknownPluginError: no backend has this name (the message lists the available ones).
        MissingDependencyError: the backend needs a module that is not installed.
        BackendUnavailableError: the backend is installed but cannot run here, with the reason
            (e.g. NCCL without CUDA); also for ``auto`` when nothing can run.
    """
    registry, label = _registry(plugin_manager)
    if normalize_name(name) == "auto":
        notes: list[str] = []
        ordered = sorted(registry, key=lambda r: -r.priority)
        for record in ordered:
            if not all(req.is_met() for req in record.requires):
                notes.append(f"{record.name} unavailable (missing module)")
                continue
            availability = _check(record)
            if availability.available:
                reason = "; ".join([*notes, f"{record.name}: {availability.reason}"])
                return Selection(record, "auto", f"auto: {reason}")
            notes.append(f"{record.name} unavailable ({availability.reason})")
        raise BackendUnavailableError(
            "auto", "; ".join(notes) or "no collective backend is installed (pip install rallypoint-gloo)", where=where
        )
    record = registry.get(name, where=where)
    record.check_requirements(label)
    availability = _check(record)
    if not availability.available:
        others = [r.name for r in sorted(registry, key=lambda r: -r.priority) if r is not record and _usable(r)]
        raise BackendUnavailableError(record.name, availability.reason, where=where, alternatives=others)
    return Selection(record, record.name, f"{record.name} as configured: {availability.reason}")


def backends_by_torch_name(
    plugin_manager: RallypointPluginManager | None = None,
) -> dict[str, CollectiveBackendRecord]:
    """Every registered backend, keyed by the lower-case name torch knows it by.

    The facade reads a process group's kind (``stream_ordered``, ``device``) from here, since
    torch reports a group's backend by its torch name (``torch.distributed.get_backend``). When
    two records share a torch name, the one with the highest priority wins.
    """
    registry, _ = _registry(plugin_manager)
    found: dict[str, CollectiveBackendRecord] = {}
    for record in sorted(registry, key=lambda r: r.priority):
        found[record.torch_name.lower()] = record
    return found


def _registry(plugin_manager: RallypointPluginManager | None) -> tuple[Registry[CollectiveBackendRecord], str]:
    from rallypoint.collectives.records import COLLECTIVE_BACKENDS

    if plugin_manager is None:
        from rallypoint.core.plugins import get_plugin_manager

        plugin_manager = get_plugin_manager()
    return plugin_manager.registry(COLLECTIVE_BACKENDS), COLLECTIVE_BACKENDS.label


def _check(record: CollectiveBackendRecord) -> Availability:
    try:
        return record.check_availability()
    except Exception as exc:  # noqa: BLE001 - a broken check means "not available", with the reason
        return Availability(False, f"its availability check failed: {type(exc).__name__}: {exc}")


def _usable(record: CollectiveBackendRecord) -> bool:
    return all(req.is_met() for req in record.requires) and _check(record).available
