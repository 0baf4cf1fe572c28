"""The machinery of the hostile-input corpora: a case, its job directory, running it, what must hold.

Each case is a job file (or something pretending to be one), some ``RALLYPOINT_*`` variables,
``--set`` overrides and ``rallypoint run`` flags; :func:`invoke` runs ``rallypoint`` in process
and :func:`assert_located` checks what every refusal must look like (see
``test_hostile_input.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rallypoint.core.cli import main

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

#: A worker that proves it ran: run must never get this far.
WORKER = "from pathlib import Path\nPath(__file__).with_name('started').write_text('a worker ran')\n"
JOB = '[job]\nentrypoint = "worker.py"\n'
FILE = "job.toml"
#: A directory even root cannot create anything in.
UNCREATABLE = "/sys/rallypoint-hostile-input"


@dataclass(frozen=True)
class Case:
    """One hostile input.

    Attributes:
        id: the test id.
        source: the label the error must name (``job.toml``, ``RALLYPOINT_X (environment)``,
            ``--flag (command line)``).
        key: the key path the error must name after the source (``""``: the whole file).
        says: a phrase of the message.
        toml: the job file's text (``JOB`` is prepended unless ``whole`` is set).
        whole: ``toml`` is the entire file, or one of ``"<zero>"`` (a symlink to /dev/zero),
            ``"<big>"`` (2 MiB of comments), ``"<fifo>"`` (a named pipe nobody writes to).
        env: ``RALLYPOINT_*`` variables.
        sets: ``--set KEY=VALUE`` overrides, for both commands.
        flags: ``rallypoint run`` flags (config check has none of them).
        check: config check can see the problem (``False`` for flags and for what only ``run``
            decides: the log directory on disk, the rendezvous backend against the node count).
    """

    id: str
    source: str
    key: str
    says: str
    toml: str = ""
    whole: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    sets: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    check: bool = True


def env(name: str) -> str:
    return f"RALLYPOINT_{name} (environment)"


def flag(name: str) -> str:
    return f"{name} (command line)"


def setting(key: str) -> str:
    return f"--set {key} (command line)"


def write_job(case: Case, tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    path = tmp_path / FILE
    if case.toml == "<zero>":
        path.symlink_to("/dev/zero")
    elif case.toml == "<fifo>":
        os.mkfifo(path)
    elif case.toml == "<big>":
        path.write_text(JOB + ("# padding padding padding padding\n" * 64 * 1024))
    elif case.toml.endswith("<latin1>"):
        path.write_bytes(case.toml.removesuffix("<latin1>").encode("latin-1"))
    else:
        path.write_text(case.toml if case.whole else JOB + case.toml)


def invoke(
    argv: list[str], case: Case, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    for name in [n for n in os.environ if n.startswith("RALLYPOINT_")]:
        monkeypatch.delenv(name)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


def assert_located(code: int, output: str, case: Case) -> None:
    assert code == 2, output
    assert "Traceback" not in output, output
    assert "internal error" not in output, output
    where = f"{case.source}: {case.key}" if case.key else f"{case.source}: "
    assert where in output, output
    assert case.says in output, output


def set_args(case: Case) -> list[str]:
    return [arg for value in case.sets for arg in ("--set", value)]


def config_check_refuses(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rallypoint config check`` refuses ``case`` with its located error."""
    write_job(case, tmp_path)
    monkeypatch.chdir(tmp_path)

    code, output = invoke(["config", "check", *set_args(case), FILE], case, monkeypatch, capsys)

    assert_located(code, output, case)


def run_refuses(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rallypoint run`` refuses ``case`` with its located error, before any worker starts."""
    write_job(case, tmp_path)
    monkeypatch.chdir(tmp_path)

    code, output = invoke(["run", *case.flags, *set_args(case), FILE], case, monkeypatch, capsys)

    assert_located(code, output, case)
    assert not (tmp_path / "started").exists(), "a worker started"
    assert (tmp_path / "worker.py").read_text() == WORKER, "the job's own files are left alone"
