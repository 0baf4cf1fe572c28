"""The agent's side of preemption notices: what it noted, and the exit code that tells a scheduler to requeue.

Under a launch environment (Slurm, Kubernetes) some signals are preemption notices
(:attr:`~rallypoint.agent.settings.AgentSettings.notice_signals`). The agent stops on those it
handles (SIGTERM) and outlives the others (Slurm's ``--signal=USR2@90`` warning) while its
workers, which get them too, checkpoint and end. Either way this node's run ended because of the
scheduler, not because the job failed or finished: the agent exits :data:`PREEMPTED_EXIT`
(75, ``EX_TEMPFAIL``: "try again later"), which a batch script (or Slurm's ``RequeueExit=75``, or a
Kubernetes ``podFailurePolicy``) turns into a requeue. Outside a launch environment nothing is a
notice and the exit codes are torchrun's (``128 + N`` after signal N).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["PREEMPTED_EXIT", "NoticeLog"]

#: The agent's exit code when a preemption notice ended its run: requeue the job to resume it.
PREEMPTED_EXIT = 75


class NoticeLog:
    """The preemption notices an agent received, and its exit code after them.

    Args:
        notice_signals: the signals that are notices here (none outside a launch environment).
        say: how the agent prints a message.
    """

    def __init__(self, notice_signals: Sequence[int], say: Callable[[str], None]) -> None:
        self.notice_signals = frozenset(int(s) for s in notice_signals)
        self.say = say
        self.outlived: list[str] = []

    def outlive(self, signum: int, _frame: Any) -> None:
        """The handler of a notice the agent does not stop on: noted; the workers got it too."""
        self.outlived.append(signal.Signals(signum).name)

    def after_signal(self, signum: int) -> int:
        """The exit code after signal ``signum`` stopped the agent: :data:`PREEMPTED_EXIT` for a notice."""
        if signum not in self.notice_signals:
            return 128 + signum
        self.say(
            f"stopped on a preemption notice ({signal.Signals(signum).name}): exit {PREEMPTED_EXIT}, requeue to resume"
        )
        return PREEMPTED_EXIT

    def after_run(self, exit_code: int) -> int:
        """The exit code of a run that ended by itself: a success after an outlived notice was cut short.

        The workers ended because of the notice (they checkpointed): the job is not done, so the
        agent exits :data:`PREEMPTED_EXIT` rather than 0. A failure stays a failure.
        """
        if exit_code != 0 or not self.outlived:
            return exit_code
        self.say(
            f"the workers ended after a preemption notice ({self.outlived[0]}), before the job's end: "
            f"exit {PREEMPTED_EXIT}, requeue to resume from their checkpoint"
        )
        return PREEMPTED_EXIT
