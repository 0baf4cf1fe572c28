"""The module-level API, shaped like ``torch.distributed.rpc``: change the import, keep the code."""

from __future__ import annotations

import gc
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from rallypoint.rpc import current
from rallypoint.rpc.agent import RpcAgent, WorkerInfo
from rallypoint.rpc.backend_options import TensorPipeRpcBackendOptions, merge_backend_options
from rallypoint.rpc.calls import call_async, call_sync
from rallypoint.rpc.current import use_agent
from rallypoint.rpc.errors import RpcError
from rallypoint.rpc.exposure import Exposure, callable_path
from rallypoint.rpc.futures import Future
from rallypoint.rpc.group import StoreGroup
from rallypoint.rpc.options import RpcOptions, transport_factory
from rallypoint.rpc.rref import RRef, remote_call
from rallypoint.rpc.torch_futures import install as install_torch_futures
from rallypoint.rpc.torch_futures import uninstall as uninstall_torch_futures

__all__ = [
    "current_agent",
    "get_rpc_timeout",
    "get_worker_info",
    "init_rpc",
    "remote",
    "rpc_async",
    "rpc_sync",
    "shutdown",
    "use_agent",
]

log = logging.getLogger("rallypoint.rpc")
T = TypeVar("T")
_NAME = re.compile(r"^[A-Za-z0-9_:.-]{1,127}$")
_STATE: dict[str, Any] = {"group": None}  # the process's agent: rallypoint.rpc.current
_LOCK = threading.Lock()


def current_agent() -> RpcAgent:
    """The agent of this process (or the one running the current incoming call).

    Raises:
        RpcError: RPC is not initialized in this process.
    """
    agent: RpcAgent = current.current_agent()
    return agent


def _env_int(name: str, environ: Mapping[str, str]) -> int:
    value = environ.get(name)
    if value is None or not value.isdigit():
        raise RpcError(f"init_rpc: pass {name.lower()}= or run under `rallypoint run` (which sets {name})")
    return int(value)


def init_rpc(
    name: str,
    backend: Any = None,
    rank: int | None = -1,
    world_size: int | None = None,
    rpc_backend_options: TensorPipeRpcBackendOptions | RpcOptions | None = None,
    *,
    options: RpcOptions | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Join the RPC group as ``name`` and start serving calls (torch's signature).

    Under ``rallypoint run`` everything comes from the environment: the rank and world size
    (``RANK``, ``WORLD_SIZE``), the store the workers meet in (``MASTER_ADDR``/``MASTER_PORT``)
    and the job's ``[rpc]`` section. Returns once every worker of the group has joined.

    Args:
        name: this worker's unique name.
        backend: ``None`` or :attr:`BackendType.TENSORPIPE` (the job's transport either way).
        rank: this worker's rank (``-1`` or ``None``: ``RANK``).
        world_size: the number of workers (``None``: ``WORLD_SIZE``).
        rpc_backend_options: torch's :class:`TensorPipeRpcBackendOptions` (the settings it was
            given override the job's ``[rpc]`` ones; those that cannot be honoured are refused)
            or an :class:`RpcOptions`.
        options: an :class:`RpcOptions` replacing the job's ``[rpc]`` section.
        environ: the environment to read (default: ``os.environ``).

    Raises:
        RpcError: already initialized, a bad name, no store, no transport, duplicate names, a
            backend option that cannot be honoured.
    """
    env = os.environ if environ is None else environ
    if not _NAME.match(name):
        raise RpcError(f"invalid RPC worker name {name!r}: use 1-127 characters among A-Z a-z 0-9 _ : . -")
    rank = _env_int("RANK", env) if rank is None or rank < 0 else rank
    world_size = _env_int("WORLD_SIZE", env) if world_size is None else world_size
    base = options if options is not None else RpcOptions.from_environment(env)
    opts = merge_backend_options(base, backend, rpc_backend_options)
    with _LOCK:
        if current.installed() is not None:
            raise RpcError(f"init_rpc called twice in this process (already {current.installed().info.name})")
        if opts.serializer == "pickle":
            message = (
                f"RPC worker {name} uses the pickle serializer ({opts.source}): any peer holding the job's token "
                "can run arbitrary code here; use it only on a trusted cluster"
            )
            log.warning(message)
            warnings.warn(message, stacklevel=2)
        make_transport = transport_factory(opts)  # before the store: no transport, no wait
        group = StoreGroup.connect(rank, world_size, opts.init_method, opts.init_timeout, env)
        transport = make_transport(group.token())
        agent = RpcAgent(
            WorkerInfo(name, rank),
            transport,
            exposure=Exposure(opts.allow, everything=opts.serializer == "pickle", program=opts.mode == "torch"),
            allow_pickle=opts.serializer == "pickle",
            timeout=opts.rpc_timeout,
        )
        try:
            me = agent.serve(opts.host or group.host)
            agent.set_peers(group.exchange(me))
            group.barrier("joined", opts.init_timeout)
        except BaseException:
            agent.close()  # no server left behind by a failed join
            raise
        current.set_installed(agent)
        _STATE.update(group=group)
        if opts.mode == "torch":
            install_torch_futures()  # torch.futures.wait_all(futs) of rpc_async's futures works unchanged


def shutdown(graceful: bool = True, timeout: float = 0) -> None:
    """Leave the group.

    Graceful (default): wait until no worker has calls outstanding (this one's, then every
    other's: a group-wide barrier), then stop serving. A worker that died instead of arriving
    ends the wait with :class:`WorkerUnavailable` naming it. ``graceful=False`` stops at once.

    Args:
        graceful: wait for the group.
        timeout: seconds for each wait (``0``: no limit).
    """
    with _LOCK:
        agent: RpcAgent | None = current.installed()
        group = _STATE["group"]
        if agent is None:
            return
        left_together = False
        try:
            if graceful:
                limit = timeout or None
                gc.collect()
                agent.flush_collected(limit)
                agent.wait_idle(limit)
                group.barrier("drained", limit, agent.dead)
                gc.collect()  # references dropped by the last calls give their credits back now
                agent.flush_collected(limit)
                agent.wait_idle(limit)
                group.barrier("stopping", limit, agent.dead)
                left_together = True
        finally:
            current.set_installed(None)
            _STATE.update(group=None)
            uninstall_torch_futures()
            agent.close()
            if left_together:
                group.close()


def get_worker_info(worker_name: str | None = None) -> WorkerInfo:
    """The :class:`WorkerInfo` of ``worker_name`` (this worker's when ``None``)."""
    agent = current_agent()
    return agent.info if worker_name is None else agent.worker(worker_name)


def get_rpc_timeout() -> float:
    """The default timeout of a call, in seconds (``0``: none)."""
    return current_agent().timeout


def rpc_async(
    to: str | int | WorkerInfo,
    func: Callable[..., T],
    args: tuple[Any, ...] | list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> Future[T]:
    """Run ``func(*args, **kwargs)`` on ``to``; returns a :class:`Future` of the result.

    Args:
        to: the callee: its name, rank or :class:`WorkerInfo`.
        func: an exposed function or class (or one in an ``allow``-ed module).
        args: positional arguments (plain data, tensors, RRefs, instances of exposed classes).
        kwargs: keyword arguments (the same kinds of values).
        timeout: seconds (``None``: the default; ``0``: none).
    """
    return call_async(current_agent(), to, func, args, kwargs, timeout)


def rpc_sync(
    to: str | int | WorkerInfo,
    func: Callable[..., T],
    args: tuple[Any, ...] | list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> T:
    """Run ``func(*args, **kwargs)`` on ``to`` and return its result (see :func:`rpc_async`)."""
    return call_sync(current_agent(), to, func, args, kwargs, timeout)


def remote(
    to: str | int | WorkerInfo,
    func: Callable[..., T],
    args: tuple[Any, ...] | list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> RRef[T]:
    """Run ``func(*args, **kwargs)`` on ``to`` and return an :class:`RRef` to the result, owned by ``to``.

    Returns at once; a failure of the call surfaces on the RRef's first use (``to_here()``, a
    method call through a proxy), with the remote exception.
    """
    agent = current_agent()
    peer = agent.worker(to)
    path = callable_path(func)
    return remote_call(agent, peer, {"fn": path}, args, kwargs, timeout, f"{peer.name}:{path}")
