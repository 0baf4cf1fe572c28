"""Watchdog timers, the worker side: a named timer with a deadline around a block of work.

A worker acquires a named timer with a deadline and releases it when the guarded work is done::

    from rallypoint import timer

    with timer.expires(after=60, scope="data_load"):
        batch = next(loader)

The server runs in the agent (:class:`~rallypoint.timer.watchdog_core.WatchdogServer`); when the
deadline passes first, the agent kills the worker's process group and reports the failure. The
process-wide client is built on first use from the worker environment the agent set
(:func:`rallypoint.timer.backends.client_from_env`), or given with :func:`configure`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping

from rallypoint.timer.watchdog_core import TimerClient, WatchdogError

__all__ = ["configure", "expires", "get_client"]

_client: TimerClient | None = None
_client_lock = threading.Lock()


def configure(client: TimerClient | None) -> None:
    """Set the process-wide client used by :func:`expires` (``None``: find it again from the env)."""
    global _client
    with _client_lock:
        _client = client


def get_client(environ: Mapping[str, str] | None = None) -> TimerClient:
    """The process-wide client; built on first use from the worker environment.

    Raises:
        WatchdogError: the environment names no watchdog (the job runs with
            ``[timer] watchdog = "off"``, or not under ``rallypoint run``).
    """
    global _client
    if _client is not None and environ is None:
        return _client
    from rallypoint.timer.backends import client_from_env  # the transports load only when used

    client = client_from_env(os.environ if environ is None else environ)
    if environ is None:
        with _client_lock:
            _client = _client or client
            return _client
    return client


def _caller_scope(depth: int = 3) -> str:
    frame = sys._getframe(depth)
    return f"{frame.f_code.co_filename}#{frame.f_lineno}"


@contextlib.contextmanager
def expires(after: float, scope: str | None = None, client: TimerClient | None = None) -> Iterator[None]:
    """Acquire a watchdog timer for the block: the worker is killed if it runs ``after`` seconds.

    Args:
        after: seconds from now until the timer expires.
        scope: the timer's name, shown in the failure report; default ``"<file>#<line>"`` of the
            caller.
        client: the client to use; default :func:`get_client` (from the worker environment).

    Example::

        with expires(after=30, scope="checkpoint"):
            save_checkpoint()
    """
    if after < 0:
        raise WatchdogError(f"expires(after={after!r}): after must be >= 0 seconds")
    scope = scope if scope is not None else _caller_scope()
    client = client or get_client()
    client.acquire(scope, time.time() + after)
    try:
        yield
    finally:
        client.release(scope)
