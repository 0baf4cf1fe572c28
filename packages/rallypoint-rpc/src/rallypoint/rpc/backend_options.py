"""torch's ``TensorPipeRpcBackendOptions`` and ``BackendType``, mapped onto :class:`RpcOptions`.

A program written for ``torch.distributed.rpc`` passes ``backend=BackendType.TENSORPIPE`` and
``rpc_backend_options=TensorPipeRpcBackendOptions(...)`` to ``init_rpc``. Here both are accepted
and translated: every setting rallypoint can honour becomes the matching :class:`RpcOptions`
field, and every setting it cannot honour is refused with an error that says why and what to use
instead, never dropped (a dropped device map would put tensors on another device than the
program expects).

Only the settings the program gave override the job's ``[rpc]`` section: an option left at
torch's default keeps the job's value (``[rpc] timeout`` stays in force unless the program
passed ``rpc_timeout=``).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from rallypoint.rpc.errors import RpcError
from rallypoint.rpc.options import RpcOptions

__all__ = ["BackendType", "TensorPipeRpcBackendOptions", "merge_backend_options"]

#: torch's defaults, reported by the options object for settings the program did not give.
_DEFAULTS: dict[str, Any] = {"num_worker_threads": 16, "rpc_timeout": 60.0, "init_method": "env://"}
#: The one TensorPipe transport list with a rallypoint equivalent: TCP only (no same-host path).
_TCP_ONLY = ["uv"]


class BackendType(enum.Enum):
    """The RPC backend of ``init_rpc(backend=...)``; ``TENSORPIPE`` is the only one torch has.

    Here ``TENSORPIPE`` selects the job's own transport (``[rpc] transport``, gRPC by default).
    """

    TENSORPIPE = "TENSORPIPE"


class TensorPipeRpcBackendOptions:
    """torch's backend options, accepted by :func:`~rallypoint.rpc.init_rpc` and mapped onto :class:`RpcOptions`.

    ``num_worker_threads``, ``rpc_timeout`` (seconds, ``0``: none) and ``init_method``
    (``"env://"`` or ``"tcp://HOST:PORT"``) map to the fields of the same name.
    ``_transports=["uv"]`` (TCP only) maps to the ``grpc`` transport's ``same_host_shm = false``.
    Refused at ``init_rpc``, with the reason: device maps and devices (tensors travel through
    host memory and arrive on the CPU), any other ``_transports`` list and ``_channels``
    (TensorPipe internals; pick the transport with ``[rpc] transport`` and ``[rpc.options]``).

    Example::

        opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=20)
        rpc.init_rpc("worker0", rank=0, world_size=2, rpc_backend_options=opts)
    """

    def __init__(
        self,
        *,
        num_worker_threads: int | None = None,
        rpc_timeout: float | None = None,
        init_method: str | None = None,
        device_maps: dict[str, dict[Any, Any]] | None = None,
        devices: list[Any] | None = None,
        _transports: list[str] | None = None,
        _channels: list[str] | None = None,
    ) -> None:
        self._given: dict[str, Any] = {}
        if num_worker_threads is not None:
            self.num_worker_threads = num_worker_threads
        if rpc_timeout is not None:
            self.rpc_timeout = rpc_timeout
        if init_method is not None:
            self.init_method = init_method
        self.device_maps: dict[str, dict[Any, Any]] = {k: dict(v) for k, v in (device_maps or {}).items()}
        self.devices: list[Any] = list(devices or [])
        self.transports = None if _transports is None else list(_transports)
        self.channels = None if _channels is None else list(_channels)

    def _get(self, name: str) -> Any:
        return self._given.get(name, _DEFAULTS[name])

    @property
    def num_worker_threads(self) -> int:
        """Threads that run incoming calls (torch's default, 16, unless given)."""
        return int(self._get("num_worker_threads"))

    @num_worker_threads.setter
    def num_worker_threads(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"num_worker_threads must be a positive integer, not {value!r}")
        self._given["num_worker_threads"] = value

    @property
    def rpc_timeout(self) -> float:
        """Default timeout of a call in seconds (``0``: none; torch's default, 60, unless given)."""
        return float(self._get("rpc_timeout"))

    @rpc_timeout.setter
    def rpc_timeout(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"rpc_timeout must be a number of seconds >= 0, not {value!r}")
        self._given["rpc_timeout"] = float(value)

    @property
    def init_method(self) -> str:
        """Where the workers meet: ``"env://"`` (``MASTER_ADDR``/``MASTER_PORT``) or ``"tcp://HOST:PORT"``."""
        return str(self._get("init_method"))

    @init_method.setter
    def init_method(self, value: str) -> None:
        self._given["init_method"] = value

    def set_device_map(self, to: str, device_map: dict[Any, Any]) -> None:
        """Record a device map towards worker ``to`` (refused by ``init_rpc``: see the class)."""
        self.device_maps.setdefault(to, {}).update(device_map)

    def set_devices(self, devices: list[Any]) -> None:
        """Record this worker's devices (refused by ``init_rpc``: see the class)."""
        self.devices = list(devices)

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self._given.items())
        return f"TensorPipeRpcBackendOptions({given})"


def _refuse_devices(opts: TensorPipeRpcBackendOptions) -> None:
    if opts.device_maps or opts.devices:
        raise RpcError(
            "init_rpc: device_maps and devices of TensorPipeRpcBackendOptions are not supported: rallypoint's "
            "transports move tensors through host memory, so every tensor arrives on the CPU and a device map "
            "could not be honoured; remove them and move tensors with .to(device) on the callee, or build the "
            "module there with RemoteModule('worker/cuda:0', ...), which moves its inputs to its device"
        )


def _transport_options(base: RpcOptions, opts: TensorPipeRpcBackendOptions) -> Any:
    if opts.channels is not None:
        raise RpcError(
            f"init_rpc: _channels={opts.channels!r} selects TensorPipe's internal channels, which rallypoint does "
            "not have; remove it (the transport is [rpc] transport, tuned by [rpc.options])"
        )
    if opts.transports is None:
        return base.transport_options
    if opts.transports != _TCP_ONLY or base.transport != "grpc":
        raise RpcError(
            f"init_rpc: _transports={opts.transports!r} cannot be mapped onto the {base.transport!r} transport: "
            "only ['uv'] (TCP only) has an equivalent, the grpc transport's same_host_shm = false; choose the "
            "transport with [rpc] transport and [rpc.options] instead"
        )
    given = base.transport_options
    if given is None or isinstance(given, dict):
        return {**(given or {}), "same_host_shm": False}
    return given.model_copy(update={"same_host_shm": False})


def merge_backend_options(
    base: RpcOptions, backend: Any, opts: TensorPipeRpcBackendOptions | RpcOptions | None
) -> RpcOptions:
    """``base`` (the job's ``[rpc]`` settings, or ``options=``) with torch's ``backend`` and options applied.

    Raises:
        RpcError: an unknown backend, options of an unknown kind, or a setting that cannot be
            honoured (the message says why and what to use).
    """
    if backend is not None and backend is not BackendType.TENSORPIPE and str(backend) != "TENSORPIPE":
        raise RpcError(
            f"init_rpc: backend={backend!r} is not supported; pass BackendType.TENSORPIPE or nothing "
            "(either way the job's [rpc] transport carries the calls)"
        )
    if opts is None:
        return base
    if isinstance(opts, RpcOptions):
        return opts
    if not isinstance(opts, TensorPipeRpcBackendOptions):
        raise RpcError(
            f"init_rpc: rpc_backend_options must be a TensorPipeRpcBackendOptions or an RpcOptions, "
            f"not {type(opts).__qualname__}"
        )
    _refuse_devices(opts)
    changes: dict[str, Any] = {"transport_options": _transport_options(base, opts)}
    given = opts._given
    if "num_worker_threads" in given:
        changes["num_worker_threads"] = opts.num_worker_threads
    if "rpc_timeout" in given:
        changes["rpc_timeout"] = opts.rpc_timeout
    if "init_method" in given:
        changes["init_method"] = None if opts.init_method == "env://" else opts.init_method
    if given:
        changes["source"] = f"{base.source} and rpc_backend_options"
    return dataclasses.replace(base, **changes)
