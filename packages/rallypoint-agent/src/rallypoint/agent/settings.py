"""The agent's settings and results: what :class:`~rallypoint.agent.agent.ElasticAgent` takes and returns."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rallypoint.agent.logs import Tee
from rallypoint.agent.ranks import DefaultStrategy, RankStrategy
from rallypoint.agent.report import FailureReport
from rallypoint.agent.spawner import interruption
from rallypoint.core.records import BackendRecord

__all__ = ["AgentResult", "AgentSettings", "AgentSignal", "Outcome", "install_signal_handlers"]


class Outcome(Enum):
    """How one attempt of the local workers ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    MEMBERSHIP = "membership"
    CLOSED = "closed"  # another node closed the job as failed


class AgentSignal(BaseException):
    """Raised in the agent's main thread when it receives a termination signal.

    A ``BaseException``, like ``KeyboardInterrupt``: code that catches ``Exception`` (a rank
    strategy, a backend) must not turn a signal into an error of its own.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.announced = False  # the agent said it received it (and stopped its workers)
        super().__init__(signal.Signals(signum).name)


def install_signal_handlers(
    signals: Sequence[int], ignored: Sequence[int] = (), on_ignored: Callable[[int, Any], None] | None = None
) -> Callable[[], None]:
    """Make ``signals`` raise :class:`AgentSignal` in the main thread; returns what restores the old handlers.

    ``ignored`` (the preemption notices the agent outlives, :attr:`AgentSettings.ignored_signals`)
    get ``on_ignored`` as their handler (one that does nothing by default), not ``SIG_IGN``, which
    workers would inherit.
    Outside the main thread (an agent run by a test or an embedding program) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handle(signum: int, _frame: Any) -> None:
        interruption(AgentSignal(signum))  # raised here, or where a hold ends (a worker's start)

    def outlive(_signum: int, _frame: Any) -> None:
        """A notice for the workers (they get it too): the agent goes on."""

    previous = {sig: signal.signal(sig, handle) for sig in signals}
    previous.update({sig: signal.signal(sig, on_ignored or outlive) for sig in ignored if sig not in previous})

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


@dataclass(frozen=True)
class AgentSettings:
    """What the agent needs besides the rendezvous handler.

    Attributes:
        argv: the worker command line (the same for every local worker).
        run_id: the job's run id.
        host: this node's host name in messages, logs and reports (the system's by default).
        max_restarts: the job-wide restart budget.
        monitor_interval: how often the rendezvous is checked while workers run, in seconds.
        exit_barrier_timeout: how long a finished node waits for the others, in seconds.
        log_dir: where per-attempt logs, error files and ``failure.json`` go.
        tee: which ranks reach the console.
        line_prefix: the template of a worker line's console prefix (:mod:`rallypoint.agent.line_prefix`).
        worker_env: extra variables for every worker (collectives backend, ``[job] env``...).
        strategy: the rank strategy, loaded (the plan loads the job's once); torchrun's by default.
        strategy_name: its name in messages.
        strategy_options: the validated ``[ranks.options]`` (the record's options model).
        stop_grace: seconds between SIGTERM and SIGKILL when stopping workers; ``signals``: those it handles.
        notice_signals: the signals the launch environment (Slurm, Kubernetes) sends as preemption
            notices; none outside one.
        ignored_signals: the notice signals the agent does not stop on (not in ``signals``):
            it outlives them while its workers, which get them too, checkpoint. After a notice
            the agent exits 75 (:mod:`rallypoint.agent.notices`).
        restarts_before: how many times the scheduler restarted (requeued) the job before this
            run (Slurm's ``SLURM_RESTART_COUNT``): the workers' ``TORCHELASTIC_RESTART_COUNT``
            goes on from it; the restart budget (``max_restarts``) is this run's own.
        fixed_allocation: the launch environment whose allocation is all the hosts the job will
            have (``"slurm"``), or ``None``: a lost host is not replaced, so a job left with
            fewer than ``nodes.min`` fails at once, naming it (:mod:`rallypoint.agent.lost_hosts`).
        cwd: the workers' working directory.
        watchdog: the watchdog timer backend's record (``[timer] watchdog``), or ``None`` for off.
        watchdog_options: its validated ``[timer.options]`` (the record's options model).
        store_head_start: seconds worker rank 0 starts before this node's other workers. It
            serves torch's ``env://`` store, and a client that finds no server yet backs off for
            about half a second; the head start makes the first connection succeed.
        rendezvous_endpoint: where the rendezvous backend is, as messages name it (e.g.
            ``"'grpc' backend at 10.0.0.1:29400"``); ``None``: the backend's class.
        hang_timeout: ``[debug] hang_timeout``: seconds without progress of this node's workers
            before the agent gathers the hang report and fails the attempt; ``0``: never.
    """

    argv: Sequence[str]
    run_id: str
    host: str | None = None
    max_restarts: int = 3
    monitor_interval: float = 0.1
    exit_barrier_timeout: float = 300.0
    log_dir: Path = Path("runs")
    tee: Tee = "all"
    line_prefix: str = "[{host}:{rank}] "
    worker_env: Mapping[str, str] = field(default_factory=dict)
    # compared by name and options: each plan loads its own instance of the same strategy
    strategy: RankStrategy = field(default_factory=DefaultStrategy, compare=False)
    strategy_name: str = "default"
    strategy_options: BaseModel | None = None
    stop_grace: float = 30.0
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    notice_signals: tuple[int, ...] = ()
    ignored_signals: tuple[int, ...] = ()
    restarts_before: int = 0
    fixed_allocation: str | None = None
    cwd: str | None = None
    watchdog: BackendRecord | None = None
    watchdog_options: BaseModel | None = None
    store_head_start: float = 0.05
    preload: tuple[str, ...] = ()  # [agent] preload: workers forked from a warm process (rallypoint.agent.warm)
    preload_env: Mapping[str, str] | None = None  # the warm process's environment (the agent's when None)
    preload_keep: float = 0.0  # [agent] preload_keep: seconds the warm process outlives the agent
    rendezvous_endpoint: str | None = None
    hang_timeout: float = 0.0


@dataclass
class AgentResult:
    """How the agent's run ended.

    Attributes:
        exit_code: 0 on success, 1 on job failure, ``128 + N`` after signal N.
        report: the failure report when the job failed.
        rounds: rendezvous rounds this agent took part in.
        restarts: restarts the job used.
        rejoins: times this node rejoined the job after it lost the rendezvous (and was dropped).
        console_not_shown: lines the agent's console did not show (see :mod:`rallypoint.agent.console`).
    """

    exit_code: int
    report: FailureReport | None = None
    rounds: int = 0
    restarts: int = 0
    rejoins: int = 0
    console_not_shown: int = 0
