"""Open a rendezvous backend: from a resolved selection, or by name for library users.

A job's ``[rendezvous]`` backend is looked up, and its ``[rendezvous.options]`` validated, once,
by core's config resolution; the result is a :class:`~rallypoint.core.config.Selection`
(the backend's record and its options model instance). :func:`open_backend` takes that
selection as given and calls the record's factory: no second lookup, no second validation.

Code that has no job file (a library user, a benchmark) builds the selection with
:func:`select_backend`, which does the lookup and the validation, once, itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from rallypoint.core.errors import PluginError
from rallypoint.rendezvous.backend import RendezvousBackend
from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS, RendezvousBackendRecord

if TYPE_CHECKING:
    from rallypoint.core.config import Selection
    from rallypoint.core.plugins import RallypointPluginManager

__all__ = ["backend_record", "open_backend", "select_backend"]

#: The job-file key that selects a rendezvous backend.
BACKEND_KEY = "rendezvous.backend"


def backend_record(selection: Selection) -> RendezvousBackendRecord:
    """The rendezvous backend record of a resolved selection.

    Raises:
        PluginError: the selection holds no rendezvous backend record (it was not resolved
            against a plugin manager that has the rendezvous subsystem).
    """
    record = selection.record
    if not isinstance(record, RendezvousBackendRecord):
        raise PluginError(
            f"{selection.key} = {selection.name!r} was not resolved to a rendezvous backend "
            f"({selection.note or 'no record'}); resolve the job config with rallypoint-rendezvous installed"
        )
    return record


def open_backend(selection: Selection, run_id: str) -> RendezvousBackend:
    """Open the backend a resolved selection names, for the job ``run_id``.

    Args:
        selection: ``resolved.selection("rendezvous.backend")``: the record and its validated
            options (or one built by :func:`select_backend`).
        run_id: the job's run id (the backend scopes its key-value space by it).

    Returns:
        ``record.factory(run_id, selection.options)``.
    """
    factory = backend_record(selection).load()
    backend: RendezvousBackend = factory(run_id, selection.options)
    return backend


def select_backend(
    name: str,
    options: Mapping[str, Any] | BaseModel | None = None,
    *,
    pm: RallypointPluginManager | None = None,
    where: str = BACKEND_KEY,
) -> Selection:
    """Look a rendezvous backend up by name and validate its options: a selection without a job file.

    This is the one validation on this path; :func:`open_backend` and
    :meth:`~rallypoint.rendezvous.handler.RendezvousHandler.from_selection` take the result as
    given. Jobs get their selection from core's config resolution instead.

    Args:
        name: the backend's name or alias (``"file"``).
        options: its options: a mapping validated against the backend's ``options_model``, or
            an instance of that model (taken as is).
        pm: the plugin manager to look in (a fresh :func:`~rallypoint.core.plugins.get_plugin_manager`
            by default).
        where: where ``name`` came from, quoted in errors.

    Raises:
        UnknownPluginError: no backend of that name (the message lists the installed ones).
        MissingDependencyError: the backend needs a module that is not installed.
        PluginError: options given to a backend that takes none.
        pydantic.ValidationError: the options do not fit the backend's model.
    """
    from rallypoint.core.config import Selection
    from rallypoint.core.plugins import get_plugin_manager

    pm = pm or get_plugin_manager()
    registry = pm.registry(RENDEZVOUS_BACKENDS)
    record = registry.get(name, where=where)
    entry = registry.entry(name)
    record.check_requirements(RENDEZVOUS_BACKENDS.label)
    model = record.options_model
    validated: BaseModel | None = None
    if model is None:
        if options:
            raise PluginError(f"rendezvous backend {record.name!r} takes no options ({where}); remove them")
    elif isinstance(options, model):
        validated = options
    else:
        raw = options.model_dump() if isinstance(options, BaseModel) else dict(options or {})
        validated = model.model_validate(raw)
    return Selection(BACKEND_KEY, name, record, entry.provider, validated)
