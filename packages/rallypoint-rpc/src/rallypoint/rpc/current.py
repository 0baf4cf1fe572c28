"""Which RPC agent a call made here goes through: the one running the current call, else the process's.

The lowest layer of the RPC package: it imports no other module of it but the errors, so every
module that needs the current agent (the API, RRefs, distributed autograd) reads it here and the
agent (:mod:`~rallypoint.rpc.agent`) sets it while it runs an incoming call, without any of
them importing another. The agent is held untyped here for that reason; callers name its type
(:class:`~rallypoint.rpc.agent.RpcAgent`) where they use it.
"""

from __future__ import annotations

import contextvars
from typing import Any

from rallypoint.rpc.errors import RpcError

__all__ = ["CURRENT_AGENT", "current_agent", "installed", "set_installed", "use_agent"]

#: The agent running the call in progress in this thread (set by :mod:`rallypoint.rpc.incoming` while it runs).
CURRENT_AGENT: contextvars.ContextVar[Any] = contextvars.ContextVar("rallypoint_rpc_agent", default=None)
_PROCESS: dict[str, Any] = {"agent": None}


def installed() -> Any:
    """The process's agent (``init_rpc``'s), or ``None``."""
    return _PROCESS["agent"]


def set_installed(agent: Any) -> None:
    """Make ``agent`` the process's agent (``None``: there is none); ``init_rpc`` and ``shutdown`` call it."""
    _PROCESS["agent"] = agent


def current_agent() -> Any:
    """The agent running the current incoming call, else the process's (an ``RpcAgent``).

    Raises:
        RpcError: RPC is not initialized in this process.
    """
    agent = CURRENT_AGENT.get() or _PROCESS["agent"]
    if agent is None:
        raise RpcError("RPC is not initialized in this process: call rallypoint.rpc.init_rpc(name) first")
    return agent


class use_agent:
    """Make ``agent`` the current one in this thread (several agents in one process, as in tests)."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent
        self._token: Any = None

    def __enter__(self) -> Any:
        self._token = CURRENT_AGENT.set(self._agent)
        return self._agent

    def __exit__(self, *exc: object) -> None:
        CURRENT_AGENT.reset(self._token)
