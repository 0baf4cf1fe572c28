"""How the file backend's watches wait: polling with a short backoff, and change tokens.

Watches poll with an exponential backoff, 0.5 ms up to the backend's ``poll_interval``
(:func:`poll`). A key watch reads the key's file; a prefix watch reads only the change token of
the prefix's first segment (:func:`token_paths`: ``round/`` wakes for ``round/...`` writes, not
for heartbeats or join records) and lists the prefix only when that token moved.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from rallypoint.rendezvous.errors import RendezvousStateError
from rallypoint_file.layout import TOKEN, quote, read_bytes

__all__ = ["poll", "read_token", "token_paths"]


def poll(changed: Callable[[], bool], timeout: float, *, verify: Callable[[], None], poll_interval: float) -> bool:
    """Call ``changed`` until it says so (``True``) or ``timeout`` passes (``False``).

    ``verify`` runs before every look (the run directory's integrity check); pauses grow from
    0.5 ms to ``poll_interval``.
    """
    deadline = time.monotonic() + max(0.0, timeout)
    pause = 0.0005
    while True:
        verify()
        if changed():
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(pause, remaining))
        pause = min(pause * 1.5, poll_interval)


def token_paths(kv: str, prefix: str) -> tuple[str, ...]:
    """The change tokens (under the ``kv`` directory) that move on every write under ``prefix``."""
    head, sep, _ = prefix.partition("/")
    if sep:
        return (os.path.join(kv, quote(head), TOKEN),)
    try:  # no '/': the prefix may match keys of any directory (rare; the handler never does this)
        dirs = sorted(d for d in os.listdir(kv) if not d.startswith("."))
    except FileNotFoundError:
        dirs = []
    return tuple(os.path.join(kv, d, TOKEN) for d in dirs)


def read_token(path: str) -> bytes | None:
    """A change token's bytes (``None`` while its directory has never been written)."""
    try:
        return read_bytes(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RendezvousStateError(f"cannot read rendezvous change token {path}: {exc}") from exc
