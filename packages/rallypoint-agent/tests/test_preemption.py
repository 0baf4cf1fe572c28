"""Preemption notices on the worker side: a notice signal sets ``preempted()`` instead of ending the worker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rallypoint.agent.preemption import PREEMPTION_SIGNALS_ENV, notice_signals

SCRIPT = textwrap.dedent(
    """
    import os, signal, time
    from rallypoint.agent.preemption import preempted, preemption_signal, watch
    watch()
    assert not preempted()
    os.kill(os.getpid(), signal.{sig})
    deadline = time.monotonic() + 5
    while not preempted() and time.monotonic() < deadline:
        time.sleep(0.01)
    print(preempted(), preemption_signal())
    """
)


@pytest.mark.parametrize(("variable", "sig"), [("SIGTERM,SIGUSR2", "SIGUSR2"), (None, "SIGTERM")])
def test_a_notice_sets_the_flag_and_the_worker_lives_on(variable: str | None, sig: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != PREEMPTION_SIGNALS_ENV}
    if variable is not None:
        env[PREEMPTION_SIGNALS_ENV] = variable
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(sig=sig)], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", sig]


def test_a_signal_not_named_still_ends_the_worker() -> None:
    env = {**os.environ, PREEMPTION_SIGNALS_ENV: "SIGTERM"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(sig="SIGUSR2")], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == -12


def test_notice_signals_parse_names_and_skip_what_cannot_be_caught() -> None:
    names = [s.name for s in notice_signals({PREEMPTION_SIGNALS_ENV: "SIGTERM, usr2,SIGKILL,NOPE"})]
    assert names == ["SIGTERM", "SIGUSR2"]
    assert [s.name for s in notice_signals({})] == ["SIGTERM"]
