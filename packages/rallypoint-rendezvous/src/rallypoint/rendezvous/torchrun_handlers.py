"""``torchrun --rdzv-backend <plugin>``: the one way a backend plugin serves torch's own agent.

A backend plugin declares an entry point in the ``torchrun.handlers`` group whose object, called
with no arguments, returns a creator ``(torch RendezvousParameters) -> torch RendezvousHandler``.
:func:`torchrun_creator` builds that creator from what the plugin already registers with
rallypoint (its :class:`~rallypoint.rendezvous.records.RendezvousBackendRecord`): torchrun's
``--rdzv-endpoint`` sets the record's ``endpoint_option``, ``--rdzv-conf key=value`` sets any other
field of its options model, and the model validates them (no job file vouched for these values);
the record's factory opens the backend. The rendezvous timeouts in ``--rdzv-conf`` are read by the
adapter (:mod:`rallypoint.rendezvous.torch_compat`).

A plugin's whole torchrun module::

    from rallypoint.rendezvous.torchrun_handlers import torchrun_creator as _creator

    def torchrun_creator():
        return _creator("rallypoint-redis", hook="my_backend.hooks:rallypoint_rendezvous_backends",
                        backend="redis", endpoint_hint="HOST:PORT (the Redis server)")

Nothing is imported when the creator is built (torch calls every entry point's object when its
rendezvous registry loads): the record, torch and the backend load when torchrun opens the
rendezvous.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

    from rallypoint.rendezvous.records import RendezvousBackendRecord

__all__ = ["backend_record", "options_from_params", "torchrun_creator"]


def backend_record(hook: str, backend: str) -> RendezvousBackendRecord:
    """The record named ``backend`` that the hook implementation at import path ``hook`` returns.

    Raises:
        ValueError: the hook returns no record of that name.
    """
    from rallypoint.core.records import load_object

    records = list(load_object(hook)())
    for record in records:
        if backend in record.names:
            found: RendezvousBackendRecord = record
            return found
    raise ValueError(f"{hook} registers no rendezvous backend {backend!r} (it registers {[r.name for r in records]})")


def options_from_params(
    torch_name: str, record: RendezvousBackendRecord, params: Any, *, endpoint_hint: str
) -> BaseModel:
    """The backend's options model instance from torch's ``RendezvousParameters``.

    Args:
        torch_name: the torchrun backend name, quoted in errors (``"rallypoint-etcd"``).
        record: the backend's record (its options model and endpoint option).
        params: torch's ``RendezvousParameters`` (``endpoint``, ``get(key)``).
        endpoint_hint: what ``--rdzv-endpoint`` must be, for the error when it is missing.

    Raises:
        ValueError: no endpoint, or an invalid option; the message names the option and the flags.
    """
    from pydantic import ValidationError

    if not params.endpoint:
        raise ValueError(f"{torch_name} needs --rdzv-endpoint {endpoint_hint}")
    model = record.options_model
    if model is None or record.endpoint_option is None:
        raise ValueError(f"{torch_name}: backend {record.name!r} declares no options model and endpoint option")
    raw: dict[str, Any] = {record.endpoint_option: params.endpoint}
    for name in model.model_fields:
        value = params.get(name) if name != record.endpoint_option else None
        if value is not None:
            raw[name] = value
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{torch_name}: invalid --rdzv-endpoint/--rdzv-conf: {problems}") from None


def torchrun_creator(torch_name: str, *, hook: str, backend: str, endpoint_hint: str) -> Callable[[Any], Any]:
    """The creator torch registers as ``torch_name``: opens ``backend`` from torchrun's flags.

    Args:
        torch_name: the name torchrun users pass to ``--rdzv-backend`` (``"rallypoint-file"``).
        hook: import path of the plugin's ``rallypoint_rendezvous_backends`` implementation.
        backend: the record's name among those the hook returns (``"file"``).
        endpoint_hint: what ``--rdzv-endpoint`` must be (``"DIR (a directory every node can reach)"``).
    """

    def create(params: Any) -> Any:
        from rallypoint.rendezvous.torch_compat import torch_handler_creator

        record = backend_record(hook, backend)

        def open_backend(run_id: str, torch_params: Any) -> Any:
            options = options_from_params(torch_name, record, torch_params, endpoint_hint=endpoint_hint)
            return record.load()(run_id, options)

        return torch_handler_creator(torch_name, open_backend)(params)

    return create
