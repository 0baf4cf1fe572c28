"""``RRef``: a reference to a value owned by one worker, usable from any worker of the group."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from rallypoint.rpc.current import current_agent
from rallypoint.rpc.errors import RpcError
from rallypoint.rpc.futures import Future
from rallypoint.rpc.gradctx import tag
from rallypoint.rpc.serialization import register_reference

if TYPE_CHECKING:
    from rallypoint.rpc.agent import RpcAgent, WorkerInfo

__all__ = ["RRef", "remote_call"]

T = TypeVar("T")


class RRef(Generic[T]):
    """A reference to a value that lives on its owner.

    ``RRef(value)`` makes this worker the owner of ``value`` (to share it with others);
    :func:`~rallypoint.rpc.remote` returns RRefs owned by the callee. An RRef passed in a call
    stays a reference to the same owner's value, and the owner keeps the value as long as any
    worker holds one.
    """

    rref_id: str
    _agent: RpcAgent
    _owner: WorkerInfo
    _creation: Future[Any] | None

    def __init__(self, value: T, type_hint: Any = None) -> None:
        """Own ``value`` here; ``type_hint`` is accepted as torch's is, and not used (it serves TorchScript)."""
        del type_hint

        agent: RpcAgent = current_agent()
        rref_id = agent.new_rref_id()
        agent.owned.incref(rref_id)  # matched by this object's credit
        agent.owned.set(rref_id, value)
        self._bind(agent, rref_id, agent.info, None)

    @classmethod
    def _attach(
        cls, agent: RpcAgent, rref_id: str, owner: WorkerInfo, creation: Future[Any] | None = None
    ) -> RRef[Any]:
        """A local RRef object for ``rref_id`` owned by ``owner``, carrying one credit."""
        rref: RRef[Any] = cls.__new__(cls)
        rref._bind(agent, rref_id, owner, creation)
        return rref

    def _bind(self, agent: RpcAgent, rref_id: str, owner: WorkerInfo, creation: Future[Any] | None) -> None:
        self._agent, self.rref_id, self._owner, self._creation = agent, rref_id, owner, creation
        agent.held.adopt(rref_id, owner.name, creation)
        # not at interpreter exit: the owners are going away too, and there is no one to tell
        weakref.finalize(self, agent.collected, rref_id).atexit = False

    def __repr__(self) -> str:
        return f"RRef(id={self.rref_id}, owner={self._owner.name})"

    def __reduce__(self) -> Any:
        raise TypeError("an RRef travels only as an argument or result of an RPC call, not through pickle")

    def owner(self) -> WorkerInfo:
        """The owner's :class:`~rallypoint.rpc.WorkerInfo`."""
        return self._owner

    def owner_name(self) -> str:
        """The owner's name."""
        return self._owner.name

    def is_owner(self) -> bool:
        """Whether this worker owns the value."""
        return self._owner.name == self._agent.info.name

    def confirmed_by_owner(self) -> bool:
        """Whether the owner has created the value (always ``True`` on the owner)."""
        return self.is_owner() or self._creation is None or self._creation.done()

    def local_value(self) -> T:
        """The value itself; only on its owner.

        Raises:
            RpcError: this worker is not the owner, or the value is unknown here.
        """
        if not self.is_owner():
            raise RpcError(
                f"local_value() of RRef {self.rref_id} called on {self._agent.info.name}, but its owner is "
                f"{self._owner.name}; use to_here() to fetch a copy"
            )
        entry = self._agent.owned.get(self.rref_id, None)
        if entry is None:
            raise RpcError(f"RRef {self.rref_id} is unknown to its owner {self._owner.name}")
        if entry.error is not None:
            raise entry.error
        return entry.value  # type: ignore[no-any-return]

    def to_here(self, timeout: float | None = None) -> T:
        """The value: itself on the owner, a copy fetched from the owner elsewhere.

        Args:
            timeout: seconds (``None``: the default RPC timeout; ``0``: none).

        Raises:
            RpcTimeout: the owner did not answer in time (names the owner).
            WorkerUnavailable: the owner is gone (names it).
        """
        if self.is_owner():
            return self.local_value()
        header = {"op": "fetch", "rref": self.rref_id, "pending": not self.confirmed_by_owner()}
        tag(self._agent, self._owner.name, header)
        what = f"RRef {self.rref_id}.to_here()"
        value: T = self._agent.call(self._owner, header, {}, timeout, what)
        return value

    def backward(self, dist_autograd_ctx_id: int = -1, retain_graph: bool = False) -> None:
        """A backward pass whose root is this RRef's value (a scalar tensor that requires grad).

        With ``dist_autograd_ctx_id`` (from ``dist_autograd.context()``), the distributed backward
        pass of that context, started on the owner: read the gradients with
        ``dist_autograd.get_gradients``. Without (``-1``), a local ``torch.autograd.backward`` on
        the owner, which must be this worker.

        Raises:
            RpcError: a local backward pass requested on a worker that is not the owner.
            ValueError: the value is not a scalar tensor that requires grad.
        """
        from rallypoint.rpc.rref_backward import backward

        backward(self, dist_autograd_ctx_id, retain_graph)

    def rpc_sync(self, timeout: float | None = None) -> Any:
        """A proxy whose method calls run on the owner and return the result: ``rref.rpc_sync().add(1)``."""
        return _Proxy(self, "sync", timeout)

    def rpc_async(self, timeout: float | None = None) -> Any:
        """A proxy whose method calls run on the owner and return a :class:`~rallypoint.rpc.Future`."""
        return _Proxy(self, "async", timeout)

    def remote(self, timeout: float | None = None) -> Any:
        """A proxy whose method calls run on the owner and return an RRef to the result (same owner)."""
        return _Proxy(self, "remote", timeout)

    def _method(
        self, mode: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
    ) -> Any:
        header: dict[str, Any] = {"rref": self.rref_id, "method": name, "pending": not self.confirmed_by_owner()}
        what = f"{self._owner.name}:RRef[{self.rref_id}].{name}"
        if mode == "remote":
            return remote_call(self._agent, self._owner, header, args, kwargs, timeout, what)
        header["op"] = "method"
        tag(self._agent, self._owner.name, header)
        values = {"args": list(args), "kwargs": kwargs}
        if mode == "sync":
            return self._agent.call(self._owner, header, values, timeout, what)
        return self._agent.send(self._owner, header, values, timeout, what)


class _Proxy:
    def __init__(self, rref: RRef[Any], mode: str, timeout: float | None) -> None:
        self._rref, self._mode, self._timeout = rref, mode, timeout

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._rref._method(self._mode, name, args, kwargs, self._timeout)

        return call


def remote_call(
    agent: RpcAgent,
    peer: WorkerInfo,
    header: dict[str, Any],
    args: Any,
    kwargs: Any,
    timeout: float | None,
    what: str,
) -> RRef[Any]:
    """Send a ``remote`` request (a function's, or a method's of an RRef's value) and return its RRef.

    ``header`` names what runs on ``peer`` (``fn``, or ``rref`` and ``method``); the new RRef is
    owned by ``peer``, and its creation completes with the request's reply.
    """
    new_id = agent.new_rref_id()
    header.update(op="remote", new=new_id)
    tag(agent, peer.name, header)
    creation = agent.send(peer, header, {"args": list(args or ()), "kwargs": dict(kwargs or {})}, timeout, what)
    return RRef._attach(agent, new_id, peer, creation)


# RRefs travel as references (see rallypoint.rpc.serialization), told from here: that module stands below this one.
register_reference(RRef, RRef._attach)
