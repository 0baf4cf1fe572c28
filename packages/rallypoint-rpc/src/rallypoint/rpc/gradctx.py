"""Which distributed autograd context is active in this thread (no torch import: the agent reads it).

:mod:`rallypoint.rpc.autograd` sets it in ``with context()`` and while a worker runs a call made
inside a context; every RPC sent while one is active carries the context's id in its header, so
the callee records its replies (and its own calls) in the same context.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

__all__ = ["ACTIVE", "Active", "current", "tag"]


@dataclass(frozen=True)
class Active:
    """The context active in this thread: the agent it belongs to and the context's state."""

    agent: Any
    context: Any

    @property
    def ctx_id(self) -> int:
        """The context's id."""
        return int(self.context.id)

    def record(self, tensor: Any) -> list[Any]:
        """The encoder sends ``tensor`` (it requires grad) in this context: its ``ad`` tag.

        The context keeps the tensor, with its graph, for the backward pass (``record_send`` of
        :class:`rallypoint.rpc.contexts.DistContext`); the tag names the context, this worker
        and the send.
        """
        return [self.context.id, self.agent.info.name, self.context.record_send(tensor)]


#: The active context (``None`` outside any).
ACTIVE: contextvars.ContextVar[Active | None] = contextvars.ContextVar("rallypoint_rpc_autograd", default=None)


def current() -> Active | None:
    """The context active in this thread, if any."""
    return ACTIVE.get()


def tag(agent: Any, to: str, header: dict[str, Any]) -> None:
    """Mark an outgoing call's ``header`` with the active context of ``agent`` (if any) and note ``to``."""
    active = ACTIVE.get()
    if active is not None and active.agent is agent:
        header["ad"] = active.ctx_id
        active.context.add_peer(to)
