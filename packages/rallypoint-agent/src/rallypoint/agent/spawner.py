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
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Spawner", "in_thread", "spawner", "wait_through"]

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


def wait_through(future: concurrent.futures.Future[_T]) -> tuple[_T, BaseException | None]:
    """The future's result; an exception raised in this thread while waiting (a signal's) waits for it.

    Returns:
        What the call returned, and the interruption that came meanwhile, or ``None``: the
        caller records the result (a started worker), then raises the interruption.

    Raises:
        BaseException: what the call raised; the interruption instead when both happened.
    """
    interruption: BaseException | None = None
    while True:
        try:
            return future.result(), interruption
        except BaseException as exc:
            if future.done() and future.exception() is exc:  # the call's own failure
                if interruption is not None:
                    raise interruption from None
                raise
            interruption = interruption or exc  # raised here while the call ran: wait for it
