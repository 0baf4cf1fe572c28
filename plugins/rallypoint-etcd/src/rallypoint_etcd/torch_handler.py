"""``torchrun --rdzv-backend rallypoint-etcd --rdzv-endpoint HOST:PORT``: the etcd backend for torch's agent.

Registered in the ``torchrun.handlers`` entry-point group; torch calls :func:`torchrun_creator`
with no arguments. torch, the etcd client and gRPC are imported only when the creator runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: ``--rdzv-conf`` keys passed on to :class:`~rallypoint_etcd.options.EtcdOptions`.
CONF_KEYS = (
    "prefix",
    "namespace",
    "connect_timeout",
    "retry_timeout",
    "key_ttl",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "username",
    "password_env",
)


def options_from_params(params: Any) -> Any:
    """:class:`~rallypoint_etcd.options.EtcdOptions` from torch's ``RendezvousParameters``.

    The endpoint (``HOST:PORT``, several separated by commas) gives ``endpoints``; ``--rdzv-conf
    key=value,...`` gives the other options.

    Raises:
        ValueError: no endpoint, or an invalid option (named).
    """
    from pydantic import ValidationError

    from rallypoint_etcd.options import EtcdOptions

    if not params.endpoint:
        raise ValueError("rallypoint-etcd needs --rdzv-endpoint HOST:PORT (an etcd client endpoint)")
    raw: dict[str, Any] = {"endpoints": params.endpoint}
    for name in CONF_KEYS:
        value = params.get(name)
        if value is not None:
            raw[name] = value
    try:
        return EtcdOptions.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"rallypoint-etcd: invalid --rdzv-endpoint/--rdzv-conf: {problems}") from None


def _open(run_id: str, params: Any) -> Any:
    from rallypoint_etcd.backend import EtcdBackend

    return EtcdBackend(run_id, options_from_params(params))


def torchrun_creator() -> Callable[[Any], Any]:
    """Return the creator torch registers as ``rallypoint-etcd``."""

    def create(params: Any) -> Any:
        from rallypoint.rendezvous.torch_compat import torch_handler_creator

        return torch_handler_creator("rallypoint-etcd", _open)(params)

    return create
