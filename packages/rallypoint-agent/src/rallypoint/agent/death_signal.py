"""The parent-death signal: a child started by the agent is killed by the kernel when the agent goes.

A child asks for ``SIGKILL`` on its parent's death with ``prctl(PR_SET_PDEATHSIG, SIGKILL)``,
called between ``fork`` and ``exec`` (``subprocess.Popen(preexec_fn=...)``). That hook must take
no lock another thread may have held at fork time, so ``prctl`` is resolved with :mod:`ctypes`
here, once, before any fork, and the hook itself neither imports, nor logs. A child whose parent
died before the call sees another parent pid right after it and kills itself.

The kernel sends the signal when the *thread* that forked exits: callers fork from the
long-lived spawner thread (:mod:`rallypoint.agent.spawner`). Elsewhere than Linux there is no such
signal (:data:`PDEATHSIG_SUPPORTED` is false). Used for workers
(:mod:`rallypoint.agent.workers`) and for the warm process (:mod:`rallypoint.agent.warm`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["PDEATHSIG_SUPPORTED", "make_preexec"]

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


_prctl = _load_prctl()
#: Whether workers get a parent-death signal on this platform (Linux with a loadable libc).
PDEATHSIG_SUPPORTED = _prctl is not None


def make_preexec(parent_pid: int) -> Callable[[], None]:
    """Build the child-side hook. Runs between fork and exec: no imports, no locks, no logging."""
    prctl = _prctl
    assert prctl is not None
    kill = os.kill
    getppid = os.getppid
    getpid = os.getpid
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0) != 0:
            return  # cannot happen for a valid signal; carry on without the safety net
        if getppid() != parent_pid:  # the agent died before prctl: the signal will never come
            kill(getpid(), sigkill)

    return preexec
