"""The live line an agent shows on a terminal while the rendezvous gathers nodes."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

from rallypoint.agent import console

if TYPE_CHECKING:
    from rallypoint.rendezvous.handler import RendezvousHandler

__all__ = ["waiting_line"]

#: How often the line is refreshed, in seconds.
REFRESH = 0.5


def _joined(handler: RendezvousHandler) -> int:
    """Nodes that joined the round being gathered (the next one while a round runs)."""
    from rallypoint.rendezvous.state import HEADER_KEY, Header, count_key

    entry = handler.backend.get(HEADER_KEY)
    header = Header.from_json(entry.value) if entry is not None else Header()
    count = handler.backend.get(count_key(header.round + 1 if header.complete else header.round))
    return int(count.value) if count is not None else 0


@contextlib.contextmanager
def waiting_line(handler: RendezvousHandler, stream: TextIO) -> Iterator[None]:
    """While the block runs, show ``waiting for nodes: N joined (min, max), Ts left`` on ``stream``.

    Only on a terminal; elsewhere (a pipe, a log file) it shows nothing. The line is erased when
    the block ends, and only if it was shown. It is queued like every agent message
    (:mod:`rallypoint.agent.console`): a terminal stopped with Ctrl-S never holds up the rendezvous.
    """
    if not (hasattr(stream, "isatty") and stream.isatty()):
        yield
        return
    stop = threading.Event()
    shown = threading.Event()
    started = time.monotonic()
    settings = handler.settings

    def show() -> None:
        while not stop.wait(REFRESH):
            try:
                joined = _joined(handler)
            except Exception:  # noqa: BLE001 - the line is cosmetic; never disturb the rendezvous
                continue
            left = max(0.0, handler.timeouts.join - (time.monotonic() - started))
            console.message(
                f"\r[rallypoint] waiting for nodes: {joined} joined (min {settings.min_nodes}, "
                f"max {settings.max_nodes}), {left:.0f}s left \x1b[K",
                stream,
            )
            shown.set()

    thread = threading.Thread(target=show, name="rallypoint-waiting-line", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1)
        if shown.is_set():
            console.message("\r\x1b[K", stream)
