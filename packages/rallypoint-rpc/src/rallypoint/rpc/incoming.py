"""Running the calls a worker receives: one request frame in, one reply frame out.

:class:`IncomingCalls` is the serving side of an :class:`~rallypoint.rpc.agent.RpcAgent`: it
checks a request's version and serializer, runs its operation (a call, a ``remote``, a method of
an owned RRef's value, a fetch, reference counts, distributed autograd) with the agent set as the
current one (:mod:`~rallypoint.rpc.current`), and encodes the result or the error as the reply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rallypoint.rpc.current import CURRENT_AGENT
from rallypoint.rpc.errors import RpcError, RpcRefused, RpcTimeout, SerializationError
from rallypoint.rpc.exposure import Exposure
from rallypoint.rpc.functions import Pending, pending
from rallypoint.rpc.futures import Future
from rallypoint.rpc.refs import OwnerTable
from rallypoint.rpc.remote_errors import describe_exception
from rallypoint.rpc.serialization import Decoder, Encoder, dumps_tree, loads_tree
from rallypoint.rpc.wire import pack_parts, unpack

__all__ = ["VERSION", "IncomingCalls", "ServingAgent"]

#: The version of the messages (a request of another version is refused).
VERSION = 1
_MAX_DECREFS = 1 << 20  # RRefs given back in one message, at most


class _Named(Protocol):
    @property
    def name(self) -> str:
        """The worker's name."""


class ServingAgent(Protocol):
    """What :class:`IncomingCalls` uses of its agent (an :class:`~rallypoint.rpc.agent.RpcAgent`)."""

    @property
    def info(self) -> _Named:
        """The agent's worker (its name is what errors name)."""

    exposure: Exposure
    allow_pickle: bool
    serializer: str
    timeout: float
    owned: OwnerTable
    decoder: Decoder

    def grant(self, rrefs: list[Any], receiver: str, limit: float | None) -> None:
        """Count a reference for ``receiver`` at each RRef's owner."""


class IncomingCalls:
    """Runs the requests peers send to one agent.

    Args:
        agent: the agent whose calls these are (set as the current agent while one runs).

    Attributes:
        ops: the operations by name (``call``, ``remote``, ``method``, ``fetch``, ``incref``,
            ``decref``, ``ping``, ``ad_grad``, ``ad_release``): ``op(tree, buffers) -> result``.
    """

    def __init__(self, agent: ServingAgent) -> None:
        self.agent = agent
        self.ops: dict[str, Callable[[dict[str, Any], list[Any]], Any]] = {
            "call": self._op_call,
            "remote": self._op_remote,
            "method": self._op_method,
            "fetch": self._op_fetch,
            "incref": self._op_incref,
            "decref": self._op_decref,
            "ping": lambda tree, bufs: None,
            "ad_grad": self._op_autograd,
            "ad_release": self._op_autograd,
        }

    @property
    def _name(self) -> str:
        return self.agent.info.name

    def handle(self, frame: Any) -> list[Any]:
        """Run one request frame and return the reply frame's parts. Never raises.

        A call to an :func:`~rallypoint.rpc.functions.async_execution` function holds this
        thread until its future completes; :meth:`handle_deferred` does not.
        """
        answer = self.handle_deferred(frame)
        if not isinstance(answer, Future):
            return answer
        try:
            parts: list[Any] = answer.wait(self.agent.timeout or None)
        except TimeoutError:
            return self.error_parts(RpcTimeout(self._name, "an async_execution reply", self.agent.timeout))
        return parts

    def handle_deferred(self, frame: Any) -> list[Any] | Future[list[Any]]:
        """:meth:`handle`, except that an async_execution call answers with a :class:`Future` of the parts.

        The future completes (never with an error) once the function's own future does; the
        thread that ran the function is free meanwhile.
        """
        token = CURRENT_AGENT.set(self.agent)
        try:
            header, bufs = unpack(frame)
            tree = loads_tree(header)
            if not isinstance(tree, dict) or tree.get("v") != VERSION:
                raise SerializationError(f"{self._name} received a message of an unknown version")
            src = str(tree.get("src", "?"))
            op = self._operation(tree, src)
            if "ad" in tree:  # sent inside a distributed autograd context: run and reply in it
                from rallypoint.rpc.autograd import serving

                with serving(self.agent, tree["ad"], src):
                    return self._answer(src, op(tree, bufs))
            return self._answer(src, op(tree, bufs), broadcasts=tree.get("op") == "ad_grad")
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            return self.error_parts(exc)
        finally:
            CURRENT_AGENT.reset(token)

    def _operation(self, tree: dict[str, Any], src: str) -> Callable[[dict[str, Any], list[Any]], Any]:
        """The request's operation, once its serializer is one this worker accepts."""
        if tree.get("ser") != self.agent.serializer and not self.agent.allow_pickle:
            raise RpcRefused(
                f"{self._name} refused a call from {src} made with the {tree.get('ser')!r} serializer: "
                'this worker uses the safe one (set serializer = "pickle" on every worker to opt in)'
            )
        op = self.ops.get(str(tree.get("op")))
        if op is None:
            raise RpcRefused(f"{self._name} refused an unknown operation {tree.get('op')!r} from {src}")
        return op

    def error_parts(self, exc: BaseException) -> list[Any]:
        """The reply frame's parts that carry ``exc`` back to the caller."""
        return pack_parts(dumps_tree({"err": describe_exception(exc, self._name)}))

    def _answer(self, src: str, result: Any, *, broadcasts: bool = False) -> list[Any] | Future[list[Any]]:
        if not isinstance(result, Pending):
            return self._reply(src, result, broadcasts=broadcasts)
        return result.reply(lambda value: self._reply(src, value), self.error_parts)

    def _reply(self, src: str, result: Any, *, broadcasts: bool = False) -> list[Any]:
        agent = self.agent
        enc = Encoder(allow_pickle=agent.allow_pickle, broadcasts=broadcasts, exposure=agent.exposure)
        tree = {"ok": enc.add(result)}
        if enc.out.rrefs:
            agent.grant(enc.out.rrefs, src, agent.timeout or None)
        return pack_parts(dumps_tree(tree), enc.out.buffers)

    def _args(self, tree: dict[str, Any], bufs: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        args = self.agent.decoder.decode(tree.get("args", []), bufs)
        kwargs = self.agent.decoder.decode(tree.get("kwargs", {"$": "dict", "items": []}), bufs)
        if (
            not isinstance(args, list | tuple)
            or not isinstance(kwargs, dict)
            or not all(isinstance(k, str) for k in kwargs)
        ):
            raise SerializationError(f"malformed arguments received by {self._name}")
        return list(args), kwargs

    def _op_call(self, tree: dict[str, Any], bufs: list[Any]) -> Any:
        fn = self.agent.exposure.resolve(str(tree.get("fn")), worker=self._name)
        args, kwargs = self._args(tree, bufs)
        return pending(fn, fn(*args, **kwargs))

    def _op_remote(self, tree: dict[str, Any], bufs: list[Any]) -> Pending | None:
        owned = self.agent.owned
        new_id = str(tree.get("new"))
        owned.incref(new_id)  # the creator's reference
        try:
            value = self._op_method(tree, bufs) if "rref" in tree else self._op_call(tree, bufs)
        except BaseException as exc:
            owned.set(new_id, error=exc)
            raise
        if isinstance(value, Pending):  # the value is the future's, once it completes
            return value.store(owned, new_id)
        owned.set(new_id, value)
        return None

    def _owned_value(self, tree: dict[str, Any]) -> Any:
        rref_id = str(tree.get("rref"))
        timeout = tree.get("timeout")
        limit = timeout if isinstance(timeout, int | float) and not isinstance(timeout, bool) else None
        entry = self.agent.owned.get(rref_id, limit, expected=tree.get("pending") is True)
        if entry is None:
            raise RpcError(f"RRef {rref_id} is unknown to its owner {self._name} (deleted, or never created)")
        if entry.error is not None:
            raise entry.error
        return entry.value

    def _op_method(self, tree: dict[str, Any], bufs: list[Any]) -> Any:
        name = str(tree.get("method"))
        if not name.isidentifier() or name.startswith("_"):
            raise RpcRefused(f"{self._name} refused a call to method {name!r}: private or not a name")
        obj = self._owned_value(tree)
        self.agent.exposure.check_class(type(obj), worker=self._name)
        method = getattr(obj, name, None)
        if not callable(method):
            raise AttributeError(f"{type(obj).__qualname__} has no method {name!r} (on {self._name})")
        args, kwargs = self._args(tree, bufs)
        return pending(method, method(*args, **kwargs))

    def _op_fetch(self, tree: dict[str, Any], bufs: list[Any]) -> Any:
        return self._owned_value(tree)

    def _op_autograd(self, tree: dict[str, Any], bufs: list[Any]) -> Any:
        from rallypoint.rpc import autograd

        grad = self.agent.decoder.decode(tree["grad"], bufs) if "grad" in tree else None
        return autograd.handle(self.agent, tree, grad)  # gradients for the sender travel in the reply

    def _op_incref(self, tree: dict[str, Any], bufs: list[Any]) -> None:
        self.agent.owned.incref(str(tree.get("rref")), _count(tree))

    def _op_decref(self, tree: dict[str, Any], bufs: list[Any]) -> None:
        refs = tree.get("refs")
        if refs is None:
            self.agent.owned.decref(str(tree.get("rref")), _count(tree))
            return
        if not isinstance(refs, dict) or len(refs) > _MAX_DECREFS:
            raise SerializationError("malformed reference counts")
        counted = [(str(rref_id), _count({"n": n})) for rref_id, n in refs.items()]  # all checked first
        for rref_id, n in counted:
            self.agent.owned.decref(rref_id, n)


def _count(tree: dict[str, Any]) -> int:
    n = tree.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n < 1 << 40:
        raise SerializationError("malformed reference count")
    return n
