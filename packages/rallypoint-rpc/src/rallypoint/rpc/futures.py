"""The future that :func:`rpc_async` returns (the subset of ``torch.futures.Future`` RPC code uses).

Also ``wait_all`` and ``collect_all``, as in ``torch.futures``: ``torch.futures.wait_all`` takes
only torch's own futures (their state lives in torch's C++ core), so a program that waits on
the futures of ``rpc_async`` calls ``rallypoint.rpc.futures.wait_all``, which takes both kinds.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

__all__ = ["Future", "collect_all", "wait_all"]

T = TypeVar("T")
S = TypeVar("S")


class Future(Generic[T]):
    """The result of an asynchronous call: :meth:`wait`, :meth:`then`, :meth:`done`.

    Callbacks run in the thread that completes the future (or at once, if it is already done),
    or, when the future was made with an ``executor``, in that executor's threads (RPC futures:
    a callback may then block, or make calls of its own, without stalling the transport).
    """

    def __init__(self, executor: Executor | None = None) -> None:
        self._executor = executor
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Future[T]], Any]] = []

    def done(self) -> bool:
        """Whether the result (or an error) is in."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> T:
        """Block until the call completes and return its result (or raise its error).

        Args:
            timeout: seconds to wait at most (``None``: the call's own timeout applies).

        Raises:
            TimeoutError: ``timeout`` passed first.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"the future was not completed within {timeout:g}s")
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[no-any-return]

    def value(self) -> T:
        """The result of a completed future (raises its error). Same as :meth:`wait` once done."""
        return self.wait()

    def exception(self) -> BaseException | None:
        """The error of a completed future, ``None`` if it succeeded or is still running."""
        return self._error

    def set_result(self, result: T) -> None:
        """Complete the future with ``result`` (only the first completion counts)."""
        self._complete(result, None)

    def set_exception(self, error: BaseException) -> None:
        """Complete the future with ``error`` (only the first completion counts)."""
        self._complete(None, error)

    def _complete(self, result: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._result, self._error = result, error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[[Future[T]], Any]) -> None:
        """Run ``callback(future)`` once the future completes; its result is ignored."""
        executor = self._executor
        if executor is not None:  # run there with this thread's context (the agent of the call running here)
            state = contextvars.copy_context()
            self._add_callback(lambda fut: _submit(executor, lambda f: state.run(callback, f), fut))
        else:
            self._add_callback(callback)

    def _add_callback(self, callback: Callable[[Future[T]], Any]) -> None:
        """Run ``callback`` in the completing thread (quick, non-blocking library callbacks only)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def then(self, callback: Callable[[Future[T]], S]) -> Future[S]:
        """A new future completed with ``callback(self)`` once this one completes.

        An exception raised by ``callback`` completes the new future with that exception.
        """
        chained: Future[S] = Future()

        def run(fut: Future[T]) -> None:
            try:
                chained.set_result(callback(fut))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the chained future
                chained.set_exception(exc)

        self.add_done_callback(run)
        return chained


def _submit(executor: Executor, callback: Callable[[Future[Any]], Any], fut: Future[Any]) -> None:
    try:
        executor.submit(callback, fut)
    except RuntimeError:  # the executor is shut down: run it here rather than never
        callback(fut)


def collect_all(futures: Iterable[Any]) -> Future[list[Any]]:
    """A future completed with the list of ``futures`` once every one of them has completed.

    Takes :class:`Future` objects and ``torch.futures.Future`` objects alike (anything with
    ``add_done_callback``). The list holds the futures themselves, completed (with a result or
    an error): ``wait()`` on each gives its result.
    """
    items = list(futures)
    together: Future[list[Any]] = Future()
    left = [len(items)]
    lock = threading.Lock()

    def one_done(_: Any) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            together.set_result(items)

    if not items:
        together.set_result([])
    for fut in items:
        fut.add_done_callback(one_done)
    return together


def wait_all(futures: Iterable[Any]) -> list[Any]:
    """Wait for every future and return their results in order, as ``torch.futures.wait_all`` does.

    Takes :class:`Future` objects and ``torch.futures.Future`` objects alike.

    Raises:
        BaseException: the error of the first future (in order) that failed.
    """
    items = list(futures)
    collect_all(items).wait()
    return [fut.wait() for fut in items]
