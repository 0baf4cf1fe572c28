"""``torchrun --rdzv-backend rallypoint-grpc --rdzv-endpoint HOST:PORT``: the grpc backend for torch's agent.

Registered in the ``torchrun.handlers`` entry-point group; torch calls :func:`torchrun_creator`
with no arguments. torch and grpc are imported only when the creator runs. As with torch's own
c10d backend, the agent on the host that owns the endpoint's address serves (``--rdzv-conf
serve=never`` turns that off, for a standalone ``rallypoint rdzv serve``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: ``--rdzv-conf`` keys passed on to :class:`~rallypoint_grpc.options.GrpcOptions`.
CONF_KEYS = (
    "serve",
    "token_file",
    "token_env",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "mutual_tls",
    "tls_server_name",
    "data_dir",
    "call_timeout",
    "retry_timeout",
    "linger",
)


def _open(run_id: str, params: Any) -> Any:
    """The grpc backend for torch's ``RendezvousParameters``, validated with :class:`GrpcOptions`."""
    from pydantic import ValidationError

    from rallypoint_grpc.backend import create_grpc_backend
    from rallypoint_grpc.options import GrpcOptions

    if not params.endpoint:
        raise ValueError("rallypoint-grpc needs --rdzv-endpoint HOST:PORT (the rendezvous server every node reaches)")
    raw: dict[str, Any] = {"endpoint": params.endpoint}
    for name in CONF_KEYS:
        value = params.get(name)
        if value is not None:
            raw[name] = value
    try:
        opts = GrpcOptions.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"rallypoint-grpc: invalid --rdzv-endpoint/--rdzv-conf: {problems}") from None
    return create_grpc_backend(run_id, opts)


def torchrun_creator() -> Callable[[Any], Any]:
    """Return the creator torch registers as ``rallypoint-grpc``."""

    def create(params: Any) -> Any:
        from rallypoint.rendezvous.torch_compat import torch_handler_creator

        return torch_handler_creator("rallypoint-grpc", _open)(params)

    return create
