"""A function run on a peer through a given agent: what ``rpc_sync`` and ``rpc_async`` send.

The API (:mod:`~rallypoint.rpc.api`) calls these with the current agent; code below the API
that must run a function on a peer (``RRef.backward`` on the RRef's owner) calls them directly,
so that it does not stand on the API module, which stands on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rallypoint.rpc.exposure import callable_path
from rallypoint.rpc.gradctx import tag

if TYPE_CHECKING:
    from rallypoint.rpc.agent import RpcAgent, WorkerInfo
    from rallypoint.rpc.futures import Future

__all__ = ["call_async", "call_sync"]

T = TypeVar("T")
Args = tuple[Any, ...] | list[Any] | None


def _request(
    agent: RpcAgent, to: str | int | WorkerInfo, func: Callable[..., Any], args: Args, kwargs: dict[str, Any] | None
) -> tuple[WorkerInfo, dict[str, Any], dict[str, Any], str]:
    peer = agent.worker(to)
    path = callable_path(func)
    values = {"args": list(args or ()), "kwargs": dict(kwargs or {})}
    header = {"op": "call", "fn": path}
    tag(agent, peer.name, header)
    return peer, header, values, f"{peer.name}:{path}"


def call_async(
    agent: RpcAgent,
    to: str | int | WorkerInfo,
    func: Callable[..., T],
    args: Args,
    kwargs: dict[str, Any] | None,
    timeout: float | None,
) -> Future[T]:
    """Run ``func(*args, **kwargs)`` on ``to`` through ``agent``; a future of the result (``rpc_async``)."""
    peer, header, values, what = _request(agent, to, func, args, kwargs)
    return agent.send(peer, header, values, timeout, what)


def call_sync(
    agent: RpcAgent,
    to: str | int | WorkerInfo,
    func: Callable[..., T],
    args: Args,
    kwargs: dict[str, Any] | None,
    timeout: float | None,
) -> T:
    """Run ``func(*args, **kwargs)`` on ``to`` through ``agent`` and return its result (``rpc_sync``)."""
    peer, header, values, what = _request(agent, to, func, args, kwargs)
    result: T = agent.call(peer, header, values, timeout, what)
    return result
