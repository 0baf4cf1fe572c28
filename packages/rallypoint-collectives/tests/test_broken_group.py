"""A worker whose collective timed out ends at once, and the agent reports it.

After :class:`~rallypoint.collectives.CollectiveTimeout` the timed-out call is still pending
inside Gloo until Gloo's own timeout (the job default plus 10 s); torch's process-group
destructor waits for it. These tests run real workers through ``rallypoint run`` with a job
default of 60 s (Gloo's own timeout: 70 s): rank 1 never joins a barrier with ``timeout=1``, and
rank 0 must be gone within seconds of its ``CollectiveTimeout``, not 70 s later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

#: Seconds from rank 0's CollectiveTimeout to its exit as seen by the agent. The exit itself takes
#: well under a second; the bound leaves room for a loaded machine (the agent polls every 0.1 s).
#: Without the broken-group handling the exit comes after Gloo's own timeout, about 70 s later.
PROMPT = 5.0


@pytest.mark.parametrize("mode", ["destroy", "raise"])
def test_worker_exits_promptly_after_a_collective_timeout(launch: Callable[..., Any], mode: str) -> None:
    result = launch("abandoned.py", 2, args=[mode], timeout=60, deadline=150)
    rank0 = result.workers[0]
    (seen,) = rank0.lines("TIMED_OUT")
    timed_out_at = float(seen.split()[0])
    assert "missing=[1]" in seen, seen

    # the agent saw the failure and reported it: rank 0 is the root cause, with its exit code
    assert result.returncode != 0, result.stderr
    assert result.failure is not None, result.stderr
    root = result.failure["root_cause"]
    assert root["rank"] == 0, result.failure
    assert root["exit_code"] == 1, result.failure
    (message,) = rank0.lines("ERROR")
    assert "barrier on WORLD" in message, message
    assert "rank 1 did not arrive" in message, message
    if mode == "raise":  # the uncaught error's traceback is in the worker's log
        assert "rallypoint.collectives.errors.CollectiveTimeout: barrier on WORLD" in rank0.stdout, rank0.stdout
    assert "rank 0" in result.stderr, result.stderr

    delay = root["time"] - timed_out_at
    assert delay < PROMPT, f"rank 0 exited {delay:.1f}s after its CollectiveTimeout (bound {PROMPT:g}s)"
    print(f"rank 0 ({mode}) exited {delay:.3f}s after its CollectiveTimeout")


class _FakeGroup:
    """Stands in for a torch process group: counts ``abort()`` calls."""

    def __init__(self) -> None:
        self.aborts = 0

    def abort(self) -> None:
        self.aborts += 1


def test_a_broken_group_is_pinned_and_aborted_once() -> None:
    import sys

    from rallypoint.collectives import broken

    group, other = _FakeGroup(), _FakeGroup()
    before = sys.getrefcount(group)
    broken.mark_broken(group)  # type: ignore[arg-type]
    broken.mark_broken(group)  # type: ignore[arg-type]  # a second timeout: pinned once
    broken.mark_broken(other)  # type: ignore[arg-type]
    assert broken.is_broken(group)  # type: ignore[arg-type]
    # one reference held for good (its destructor must never run) plus the registry's own
    assert sys.getrefcount(group) == before + 2

    broken.abort(group)  # type: ignore[arg-type]
    assert group.aborts == 1
    assert other.aborts == 0
    assert not broken.is_broken(group)  # type: ignore[arg-type]
    broken.abort()  # every broken group left: only ``other``
    broken.abort()
    assert (group.aborts, other.aborts) == (1, 1)
    assert sys.getrefcount(group) == before + 1  # still pinned after the abort
