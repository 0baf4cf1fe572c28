"""Options of :func:`~rallypoint.rpc.init_rpc`, from the caller or from the job's ``[rpc]`` section."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rallypoint.rpc.errors import RpcError

__all__ = ["RpcOptions", "make_transport", "transport_factory"]

_PREFIX = "RALLYPOINT_RPC_"


@dataclass
class RpcOptions:
    """How this worker joins the RPC group.

    Attributes:
        rpc_timeout: default timeout of a call in seconds (``0``: none).
        serializer: ``"safe"`` (default) or ``"pickle"`` (explicit opt-in; logs a warning).
        allow: modules whose public functions and classes peers may call (``"pkg"``, ``"pkg.*"``).
        mode: ``"rallypoint"`` (default: only what is exposed or allowed is callable) or
            ``"torch"`` (the program's own modules are callable too, as under torch).
        transport: the RPC transport's name (``rallypoint plugins list`` shows those installed).
        transport_options: the transport's options: its model instance or a dict to validate.
        num_worker_threads: threads that run incoming calls.
        init_method: ``"tcp://HOST:PORT"`` of the store the workers meet in; default (``None`` or
            ``"env://"``): ``MASTER_ADDR``/``MASTER_PORT``, or the default process group's store
            when ``torch.distributed`` is initialized.
        init_timeout: seconds to wait for every worker to join (and to leave, at shutdown).
        host: the address this worker serves on (default: the one that routes to the store).
    """

    rpc_timeout: float = 60.0
    serializer: Literal["safe", "pickle"] = "safe"
    allow: Sequence[str] = ()
    mode: Literal["rallypoint", "torch"] = "rallypoint"
    transport: str = "grpc"
    transport_options: Any = None
    num_worker_threads: int = 16
    init_method: str | None = None
    init_timeout: float = 300.0
    host: str | None = None
    source: str = field(default="init_rpc options", repr=False)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> RpcOptions:
        """The job's ``[rpc]`` settings as the agent resolved them (``RALLYPOINT_RPC_*``).

        ``rallypoint run`` gives every worker the job's resolved ``[rpc]`` section as
        ``RALLYPOINT_RPC_<KEY>`` variables, whatever set each value (job file, ``--set``, the
        agent's environment); anyone else may set them too. Without any, the defaults.

        Raises:
            ConfigError: a variable holds an invalid value, or the transport's options are
                invalid (the message names the variable and the key).
        """
        env = os.environ if environ is None else environ
        given = {name: value for name, value in env.items() if name.startswith(_PREFIX)}
        if not given:
            return cls(source="defaults")
        from rallypoint.core.config import load_job_config, resolve_config
        from rallypoint.core.plugins import get_plugin_manager
        from rallypoint.rpc.config import RpcSection

        pm = get_plugin_manager(environ=dict(env))
        resolved = resolve_config(load_job_config(None, pm, environ=given), pm)
        section = resolved.section(RpcSection)
        selection = resolved.selection("rpc.transport")
        job_file = env.get("RALLYPOINT_CONFIG")
        return cls(
            rpc_timeout=section.timeout,
            serializer=section.serializer,
            allow=tuple(section.allow),
            mode=section.mode,
            transport=section.transport,
            transport_options=selection.options if selection is not None else None,
            num_worker_threads=section.num_worker_threads,
            source=f"[rpc] of {job_file}" if job_file else "RALLYPOINT_RPC_* (environment)",
        )


def transport_factory(options: RpcOptions) -> Callable[[str], Any]:
    """The selected transport's factory, its options validated: call it with the job's token.

    ``init_rpc`` calls this before it reaches the store, so a worker without its transport
    fails at once, not after waiting for its peers.

    Raises:
        RpcError: no such transport installed (saying what to install), or its options are invalid.
    """
    from pydantic import BaseModel, ValidationError

    from rallypoint.core.errors import RallypointError
    from rallypoint.core.plugins import get_plugin_manager
    from rallypoint.core.records import load_object
    from rallypoint.rpc.records import RPC_TRANSPORTS

    pm = get_plugin_manager()
    registry = pm.registry(RPC_TRANSPORTS)
    try:
        record = registry.get(options.transport, where=options.source)
    except RallypointError as exc:
        failure = pm.failure_named(options.transport)  # disabled, or failed to import
        if failure is not None:
            raise RpcError(f"init_rpc: {failure.error}") from None
        if not registry.names():
            raise RpcError(
                f"init_rpc: the RPC transport {options.transport!r} ({options.source}) is not installed, and "
                f"rallypoint-rpc makes no calls without one: {RPC_TRANSPORTS.install_hint}"
            ) from None
        raise RpcError(f"init_rpc: {exc}") from None
    model = record.options_model
    given = options.transport_options
    if model is not None and not isinstance(given, BaseModel):
        try:
            given = model.model_validate(given or {})
        except ValidationError as exc:
            raise RpcError(f"invalid options for RPC transport {record.name} ({options.source}): {exc}") from None
    factory = load_object(record.factory)
    threads = options.num_worker_threads
    return lambda token: factory(given, token=token, num_threads=threads)


def make_transport(options: RpcOptions, token: str) -> Any:
    """The selected transport, built by its plugin's factory (:func:`transport_factory` then the call).

    Raises:
        RpcError: no such transport installed, or its options are invalid.
    """
    return transport_factory(options)(token)
