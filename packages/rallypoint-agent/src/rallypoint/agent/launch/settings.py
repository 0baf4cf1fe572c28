"""What a detected launch environment decides in a node's plan, besides the job keys it fills in.

:func:`launch_settings` turns :class:`~rallypoint.agent.launch.facts.LaunchFacts` into what
:func:`~rallypoint.agent.plan.plan_job` puts in the agent's settings: this node's identity, the
workers' variables (the notice signals, the scheduler's restart count), the signals that are
preemption notices, and those among them the agent outlives rather than stops on.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rallypoint.agent.launch.facts import LaunchFacts
from rallypoint.agent.preemption import PREEMPTION_SIGNALS_ENV

__all__ = ["LAUNCH_RESTART_COUNT_ENV", "LaunchSettings", "launch_settings"]

#: The variable that tells workers how many times the scheduler restarted (requeued) the job.
LAUNCH_RESTART_COUNT_ENV = "RALLYPOINT_LAUNCH_RESTART_COUNT"


@dataclass(frozen=True)
class LaunchSettings:
    """The plan's share of a launch environment (all empty outside one).

    Attributes:
        node_id: this node's identity as the scheduler names it (used when ``--node-id`` is not given).
        worker_env: variables every worker gets (``[job] env`` wins over them).
        notice_signals: the signals the scheduler sends as preemption notices.
        ignored_signals: the notice signals the agent does not stop on (Slurm's ``--signal=USR2@90``
            warning): it outlives them, and its workers, which get them too, checkpoint.
        restarts_before: how many times the scheduler restarted the job before this run.
        fixed_allocation: the launch environment's name when a lost host is not replaced.
    """

    node_id: str | None = None
    worker_env: Mapping[str, str] = field(default_factory=dict)
    notice_signals: tuple[signal.Signals, ...] = ()
    ignored_signals: tuple[signal.Signals, ...] = ()
    restarts_before: int = 0
    fixed_allocation: str | None = None


def _signals(names: Sequence[str]) -> tuple[signal.Signals, ...]:
    found = [signal.Signals[n] for n in names if n in signal.Signals.__members__ and n not in ("SIGKILL", "SIGSTOP")]
    return tuple(dict.fromkeys(found))


def launch_settings(facts: LaunchFacts | None, handled: Sequence[int]) -> LaunchSettings:
    """The plan's share of ``facts``; empty settings for ``None`` (no launch environment).

    Args:
        facts: what the launch environment detected, or ``None``.
        handled: the signals the agent stops on (``agent.signals_to_handle``): a notice signal
            among them stops the agent as any of them does; the others are ignored by it.
    """
    if facts is None:
        return LaunchSettings()
    notices = _signals(facts.preemption_signals)
    env = {
        PREEMPTION_SIGNALS_ENV: ",".join(s.name for s in notices),
        LAUNCH_RESTART_COUNT_ENV: str(facts.restart_count),
    }
    return LaunchSettings(
        node_id=facts.node_id,
        worker_env=env,
        notice_signals=notices,
        ignored_signals=tuple(s for s in notices if s not in handled),
        restarts_before=facts.restart_count,
        fixed_allocation=facts.environment if facts.fixed_allocation else None,
    )
