"""Process groups left broken by a timed-out call, and letting them go without waiting.

A call that raised :class:`~rallypoint.collectives.CollectiveTimeout` may still be pending inside
torch. On Gloo it runs on a worker thread of the process group, which keeps waiting for the
missing ranks until the group's own timeout (the job default plus
:data:`~rallypoint.collectives.state.PG_TIMEOUT_MARGIN`, over ten minutes by default), and the
group's C++ destructor joins that thread. torch 2.13's ``ProcessGroup.abort()``, ``shutdown()``
and ``_abort_process_group()`` do not interrupt it. So ``destroy()``, or the interpreter's exit
dropping the last reference to the group, would block that long, and the agent could not restart
the job.

When a call times out, :func:`mark_broken` therefore:

* pins the group's torch object (one reference that is never released), so that its destructor
  never runs: the process does not wait for the pending call, and the operating system reclaims
  the group's threads and sockets when the process ends;
* remembers it, so that :func:`abort` (which ``destroy()`` calls) and the interpreter's exit call
  ``ProcessGroup.abort()`` on it: stream-ordered backends (NCCL) end their communicators without
  waiting; for Gloo it changes nothing, and is harmless.

The group stays usable for whatever still works on it (Gloo's point-to-point pairs do); it is
merely never torn down by its destructor. Importing this module imports torch.
"""

from __future__ import annotations

import atexit
import ctypes
import logging

import torch.distributed as _dist

__all__ = ["abort", "is_broken", "mark_broken"]

log = logging.getLogger("rallypoint.collectives")

#: Broken groups not yet aborted, by ``id()`` (stable: a pinned object is never freed).
_BROKEN: dict[int, _dist.ProcessGroup] = {}
#: ``id()`` of every group ever pinned.
_PINNED: set[int] = set()
_AT_EXIT = False


def mark_broken(pg: _dist.ProcessGroup) -> None:
    """Pin ``pg`` (its destructor never runs) and remember it for :func:`abort`. Never raises."""
    try:
        key = id(pg)
        if key not in _PINNED:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(pg))
            _PINNED.add(key)
        _BROKEN[key] = pg
        _abort_at_exit()
    except Exception as exc:  # noqa: BLE001 - the timeout error itself matters more
        log.warning("collectives: could not mark the timed-out process group as broken: %s", exc)


def is_broken(pg: _dist.ProcessGroup) -> bool:
    """Whether a call on ``pg`` timed out (and ``pg`` has not been aborted since)."""
    return id(pg) in _BROKEN


def abort(pg: _dist.ProcessGroup | None = None) -> None:
    """Abort ``pg`` if it is broken (default: every broken group); never blocks on Gloo, never raises."""
    keys = list(_BROKEN) if pg is None else [id(pg)]
    for key in keys:
        group = _BROKEN.pop(key, None)
        if group is None:
            continue
        try:
            group.abort()
        except Exception as exc:  # noqa: BLE001 - it is pinned: nothing will wait for it anyway
            log.debug("collectives: aborting a broken process group failed: %s", exc)


def _abort_at_exit() -> None:
    global _AT_EXIT
    if not _AT_EXIT:
        atexit.register(abort)
        _AT_EXIT = True
