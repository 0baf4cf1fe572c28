"""The worker side of preemption notices: ``preempted()`` turns true when the scheduler warns.

A scheduler stops a job with a signal, and may warn ahead of it: Slurm's ``scancel`` and the end
of a time limit send SIGTERM (then SIGKILL after ``KillWait``), and ``sbatch --signal=USR2@90``
sends SIGUSR2 90 seconds before the limit; Kubernetes sends SIGTERM, then SIGKILL after the pod's
grace period. The agent tells its workers which signals are notices in
``RALLYPOINT_PREEMPTION_SIGNALS`` (``SIGTERM,SIGUSR2`` under Slurm; ``SIGTERM`` otherwise).

A training script calls :func:`watch` once at its start (or lets the first :func:`preempted`
call do it); from then on those signals no longer end the process: they set a flag the script
polls between steps, so it can write a checkpoint and exit::

    from rallypoint.agent.preemption import preempted, watch

    watch()
    for step in range(start, steps):
        train_one_step()
        if preempted():
            save_checkpoint(step + 1)
            break

Importing this module imports no torch and starts nothing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping, Sequence

__all__ = ["PREEMPTION_SIGNALS_ENV", "notice_signals", "preempted", "preemption_signal", "watch"]

#: The variable naming the notice signals (comma-separated names), set by the agent for workers.
PREEMPTION_SIGNALS_ENV = "RALLYPOINT_PREEMPTION_SIGNALS"

_received = threading.Event()
_signal: list[str] = []
_watching: list[bool] = []


def notice_signals(environ: Mapping[str, str] | None = None) -> list[signal.Signals]:
    """The notice signals ``RALLYPOINT_PREEMPTION_SIGNALS`` names (default SIGTERM); unknown names are skipped."""
    env = os.environ if environ is None else environ
    names = [n.strip().upper() for n in env.get(PREEMPTION_SIGNALS_ENV, "SIGTERM").split(",") if n.strip()]
    found = []
    for name in names:
        full = name if name.startswith("SIG") else f"SIG{name}"
        if full in signal.Signals.__members__ and full not in ("SIGKILL", "SIGSTOP"):
            found.append(signal.Signals[full])
    return found


def _on_notice(signum: int, _frame: object) -> None:
    if not _signal:
        _signal.append(signal.Signals(signum).name)
    _received.set()


def watch(signals: Sequence[signal.Signals] | None = None) -> None:
    """Turn the notice signals into the :func:`preempted` flag (main thread only; once is enough)."""
    if _watching or threading.current_thread() is not threading.main_thread():
        return
    for sig in notice_signals() if signals is None else signals:
        signal.signal(sig, _on_notice)
    _watching.append(True)


def preempted() -> bool:
    """Whether a preemption notice arrived (the first call starts watching, see :func:`watch`)."""
    watch()
    return _received.is_set()


def preemption_signal() -> str | None:
    """The name of the first notice signal received (``"SIGTERM"``), or ``None``."""
    return _signal[0] if _signal else None
