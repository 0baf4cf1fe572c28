"""Hostile input that used to be found late: after start-up (exit 1), never (a hang), or misreported.

The second corpus of hostile input (issue #35), run like the first (``test_hostile_input.py``):
through ``rallypoint config check`` where it can see the problem, and through ``rallypoint run``,
each must exit 2 before anything starts, naming where the value came from and its key, with no
traceback and no "internal error".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import FILE, Case, config_check_refuses, run_refuses

CASES = [
    # a job file that is a named pipe: opening it waited for a writer for ever
    Case("job-file-fifo", FILE, "", "is a named pipe (FIFO)", "<fifo>", whole=True),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", [c for c in CASES if c.check], ids=lambda c: c.id)
def test_config_check_locates_the_problem(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config_check_refuses(case, tmp_path, monkeypatch, capsys)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_run_refuses_before_any_worker_starts(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_refuses(case, tmp_path, monkeypatch, capsys)
