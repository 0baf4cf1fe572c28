"""rallypoint RPC: ``rpc_sync``, ``rpc_async``, ``remote`` and RRefs over pluggable transports.

Shaped like ``torch.distributed.rpc``: ``from rallypoint import rpc`` and the usual calls work
(``rpc.init_rpc``, ``rpc.rpc_sync``, ``rpc.remote``, ``rpc.RRef``...). Safe by default: peers
may call only what is exposed (:func:`expose`, or modules in ``[rpc] allow``) and nothing
received is unpickled. Hook specifications live in :mod:`rallypoint.rpc.hookspecs`.

Distributed autograd is :mod:`rallypoint.rpc.autograd` (``context``, ``backward``,
``get_gradients``), with :class:`DistributedOptimizer` and :class:`RemoteModule`.

Importing this package is cheap (the plugin system loads it in every process); the API modules
load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rallypoint.rpc.records import RpcTransportRecord

if TYPE_CHECKING:
    from rallypoint.rpc import autograd, functions, futures, nn
    from rallypoint.rpc.agent import WorkerInfo
    from rallypoint.rpc.api import (
        get_rpc_timeout,
        get_worker_info,
        init_rpc,
        remote,
        rpc_async,
        rpc_sync,
        shutdown,
    )
    from rallypoint.rpc.backend_options import BackendType, TensorPipeRpcBackendOptions
    from rallypoint.rpc.errors import (
        RemoteException,
        RpcError,
        RpcRefused,
        RpcTimeout,
        SerializationError,
        WorkerUnavailable,
    )
    from rallypoint.rpc.exposure import expose
    from rallypoint.rpc.futures import Future
    from rallypoint.rpc.optimizer import DistributedOptimizer
    from rallypoint.rpc.options import RpcOptions
    from rallypoint.rpc.remote_module import RemoteModule
    from rallypoint.rpc.rref import RRef

__all__ = [
    "init_rpc",
    "shutdown",
    "rpc_sync",
    "rpc_async",
    "remote",
    "get_worker_info",
    "get_rpc_timeout",
    "expose",
    "RRef",
    "RemoteModule",
    "DistributedOptimizer",
    "autograd",
    "functions",
    "futures",
    "nn",
    "BackendType",
    "TensorPipeRpcBackendOptions",
    "Future",
    "WorkerInfo",
    "RpcOptions",
    "RpcError",
    "RpcTimeout",
    "RpcRefused",
    "RemoteException",
    "SerializationError",
    "WorkerUnavailable",
    "RpcTransportRecord",
]

_WHERE = {
    "init_rpc": "api",
    "shutdown": "api",
    "rpc_sync": "api",
    "rpc_async": "api",
    "remote": "api",
    "get_worker_info": "api",
    "get_rpc_timeout": "api",
    "expose": "exposure",
    "RRef": "rref",
    "RemoteModule": "remote_module",
    "DistributedOptimizer": "optimizer",
    "Future": "futures",
    "WorkerInfo": "agent",
    "RpcOptions": "options",
    "BackendType": "backend_options",
    "TensorPipeRpcBackendOptions": "backend_options",
    "RpcError": "errors",
    "RpcTimeout": "errors",
    "RpcRefused": "errors",
    "RemoteException": "errors",
    "SerializationError": "errors",
    "WorkerUnavailable": "errors",
}

_SUBMODULES = frozenset({"autograd", "functions", "futures", "nn"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value = importlib.import_module(f"rallypoint.rpc.{name}")
        globals()[name] = value
        return value
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rallypoint.rpc' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rallypoint.rpc.{module}"), name)
    globals()[name] = value
    return value
