"""``rpc.functions.async_execution``: functions that answer an RPC when a future completes.

A function decorated with :func:`async_execution` returns a future (a
:class:`~rallypoint.rpc.Future` or a ``torch.futures.Future``) instead of its result. When a
peer calls it (``rpc_sync``, ``rpc_async``, ``remote`` or an RRef proxy), the callee runs it,
lets the thread go, and replies once the future completes: with its value, or with the error set
on it. A batch-processing server can so hold many callers' replies until a batch is full, and a
function can answer with the future of an RPC it made in turn, without a thread waiting for
either.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rallypoint.rpc.futures import Future

if TYPE_CHECKING:
    from rallypoint.rpc.refs import OwnerTable

__all__ = ["Pending", "async_execution", "is_async_execution", "pending"]

_MARK = "__rallypoint_rpc_async_execution__"
F = TypeVar("F", bound=Callable[..., Any])


def async_execution(fn: F) -> F:
    """Mark ``fn`` as returning a future whose completion answers the RPC that called it.

    ``fn`` itself is returned (calling it locally returns its future). It is still called only
    if it is exposed (``@rpc.expose``, or a method of an exposed class). On a static or class
    method, put ``@staticmethod``/``@classmethod`` above this decorator. Example::

        @rpc.expose
        @rpc.functions.async_execution
        def add_later(to, x):
            return rpc.rpc_async(to, torch.add, args=(x, 1)).then(lambda fut: fut.wait() * 2)
    """
    try:
        setattr(fn, _MARK, True)
    except (AttributeError, TypeError):
        raise TypeError(f"async_execution cannot mark {fn!r}; decorate a function or method") from None
    return fn


def is_async_execution(fn: Any) -> bool:
    """Whether ``fn`` (a function, or a bound method of one) is marked with :func:`async_execution`."""
    return bool(getattr(getattr(fn, "__func__", fn), _MARK, False))


class Pending:
    """The future an :func:`async_execution` function returned, for the agent to reply on."""

    def __init__(self, future: Any) -> None:
        self.future = future

    def on_done(self, callback: Callable[[Callable[[], Any]], None]) -> None:
        """Call ``callback(result)`` once the future completes; ``result()`` returns its value or raises."""
        self.future.add_done_callback(lambda fut: callback(fut.wait))

    def reply(
        self, encode: Callable[[Any], list[Any]], encode_error: Callable[[BaseException], list[Any]]
    ) -> Future[list[Any]]:
        """A future of the reply's parts: ``encode(value)``, or ``encode_error(error)``; never fails.

        ``encode`` runs in the thread that completes the future, with the context variables of
        the thread calling this (the agent running the call, its distributed autograd context).
        """
        state = contextvars.copy_context()
        answer: Future[list[Any]] = Future()

        def done(result: Callable[[], Any]) -> None:
            try:
                answer.set_result(state.run(encode, result()))
            except BaseException as exc:  # noqa: BLE001 - the error set on the future goes to the caller
                answer.set_result(encode_error(exc))

        self.on_done(done)
        return answer

    def store(self, owned: OwnerTable, rref_id: str) -> Pending:
        """Own the future's value (or error) as ``rref_id`` once it completes (``remote``).

        Returns what the ``remote`` call answers with: ``None`` once the value is owned, or the error.
        """
        created: Future[None] = Future()

        def done(result: Callable[[], Any]) -> None:
            try:
                owned.set(rref_id, result())
            except BaseException as exc:  # noqa: BLE001 - the RRef's users and its creator get the error
                owned.set(rref_id, error=exc)
                created.set_exception(exc)
            else:
                created.set_result(None)

        self.on_done(done)
        return Pending(created)


def pending(fn: Any, result: Any) -> Any:
    """``result`` of calling ``fn``, as a :class:`Pending` when ``fn`` is an async_execution function.

    Raises:
        TypeError: an async_execution function returned something that is not a future.
    """
    if not is_async_execution(fn):
        return result
    if not (callable(getattr(result, "add_done_callback", None)) and callable(getattr(result, "wait", None))):
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(f"{name} is marked async_execution but returned {type(result).__qualname__}, not a future")
    return Pending(result)
