"""The thread that forks the agent's child processes, and a call of it that a signal cannot split.

Linux sends a child's parent-death signal when the *thread* that forked it exits, not the
process; every worker (and the warm process) is therefore forked by one long-lived thread owned
by this module, so starting workers from a short-lived thread (an executor, a test) does not kill
them when it ends.

The agent turns its termination signals into an exception raised in its main thread
(:class:`~rallypoint.agent.settings.AgentSignal`). One that came while the main thread waited for a
fork would lose the child: started, but never handed back to be recorded, signalled and reaped.
:func:`wait_through` waits the fork out first and hands back both.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["Spawner", "in_thread", "interruption", "interruptions_held", "spawner", "wait_through"]

_T = TypeVar("_T")


class Spawner:
    """A long-lived daemon thread that runs the calls it is given, one at a time, in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """Queue ``fn`` for the spawner thread; its future holds the result or the exception."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        if threading.current_thread() is self._thread:
            future.set_result(fn())
            return future
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="rallypoint-spawner", daemon=True)
                self._thread.start()
        self._jobs.put((fn, future))
        return future

    def call(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` in the spawner thread and return what it returned (or raise what it raised)."""
        return self.submit(fn).result()

    def _run(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)
            del fn, future  # hold no reference to the caller's objects between jobs


spawner = Spawner()
"""The agent process's spawner."""


def in_thread(fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
    """Run ``fn`` in a new daemon thread (for what forks nothing here: a warm process's worker)."""
    future: concurrent.futures.Future[_T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)

    threading.Thread(target=run, name="rallypoint-start", daemon=True).start()
    return future


def wait_through(
    future: concurrent.futures.Future[_T], *, patience: float | None = None
) -> tuple[_T, BaseException | None]:
    """The future's result; an exception raised in this thread while waiting (a signal's) waits for it.

    Args:
        future: the call (a fork) to wait for.
        patience: after an interruption, how many more seconds to wait for the call (``None``:
            until it ends); past them the interruption is raised and the call's result is lost.

    Returns:
        What the call returned, and the interruption that came meanwhile, or ``None``: the
        caller records the result (a started worker), then raises the interruption.

    Raises:
        BaseException: what the call raised; the interruption instead when both happened, or
            when ``patience`` ran out.
    """
    interruption: BaseException | None = None
    until: float | None = None
    while True:
        try:
            left = None if until is None else max(0.0, until - time.monotonic())
            return future.result(left), interruption
        except BaseException as exc:
            if future.done() and future.exception() is exc:  # the call's own failure
                if interruption is not None:
                    raise interruption from None
                raise
            if interruption is not None and isinstance(exc, TimeoutError) and not future.done():
                raise interruption from None  # waited long enough
            if interruption is None:  # raised here while the call ran: wait for it
                interruption = exc
                until = None if patience is None else time.monotonic() + patience


class _Held:
    """The main thread's hold on interruptions: depth of :func:`interruptions_held`, the first one held."""

    depth = 0
    pending: BaseException | None = None


def interruption(exc: BaseException) -> None:
    """What a signal handler calls instead of ``raise exc``: raised now, or held (see below)."""
    if _Held.depth and threading.current_thread() is threading.main_thread():
        _Held.pending = _Held.pending or exc
        return
    raise exc


@contextlib.contextmanager
def interruptions_held() -> Iterator[None]:
    """Hold back what signal handlers raise (through :func:`interruption`) until the block ends.

    For a few statements that must not be split (a started worker recorded, its watcher and log
    readers started): a signal that comes meanwhile is raised when the block ends. Only the main
    thread's interruptions are held; nest freely.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Held.depth += 1
    try:
        yield
    finally:
        _Held.depth -= 1
        if not _Held.depth and _Held.pending is not None:
            pending, _Held.pending = _Held.pending, None
            raise pending
