"""``rallypoint config schema`` accepts what ``rallypoint config check`` accepts (#41).

Every job file of the repository (the examples, the job files quoted in the docs) is validated
against the schema with a standard JSON Schema validator (``jsonschema``, the reference
implementation of the specification), and each must also pass ``config check``. A set of bad
job files is refused by both.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from doc_blocks import ROOT, blocks

from rallypoint.core.cli import main

#: Top-level tables that mark a TOML block as something other than a job file (a plugin's pyproject).
_NOT_JOB = {"project", "build-system", "tool"}


@pytest.fixture(scope="module")
def validator(tmp_path_factory: pytest.TempPathFactory) -> jsonschema.protocols.Validator:
    out = tmp_path_factory.mktemp("schema") / "schema.json"
    assert main(["config", "schema", "-o", str(out)]) == 0
    schema = json.loads(out.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)  # the schema itself is valid draft 2020-12, no unknown keyword misuse
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _doc_job_blocks() -> list[tuple[str, str]]:
    """``(where, text)`` of every TOML block in the docs and README that is a job file."""
    found = []
    for block in blocks("toml"):
        if block.skip or _NOT_JOB & set(tomllib.loads(block.text)):
            continue
        found.append((block.where, block.text))
    return found


def _job_files() -> list[tuple[str, str]]:
    files = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "examples").rglob("*.toml"))]
    return files + _doc_job_blocks()


JOB_FILES = _job_files()


def test_the_repository_has_job_files_to_check() -> None:
    assert sum(1 for where, _ in JOB_FILES if where.startswith("examples/")) >= 5
    assert sum(1 for where, _ in JOB_FILES if where.startswith("docs/")) >= 10


def _schema_errors(validator: Any, data: Any) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '<top>'}: {e.message}" for e in validator.iter_errors(data)]


def _check(text: str, tmp_path: Path) -> int:
    path = tmp_path / "job.toml"
    path.write_text(text)
    try:
        return main(["config", "check", str(path)])
    except SystemExit as exc:  # pragma: no cover - main returns codes; kept for a clear failure
        return int(exc.code or 0)


@pytest.mark.parametrize(("where", "text"), JOB_FILES, ids=[where for where, _ in JOB_FILES])
def test_every_job_file_passes_the_schema_and_config_check(where, text, validator, tmp_path, capsys) -> None:
    errors = _schema_errors(validator, tomllib.loads(text))
    assert not errors, f"{where}: the schema refuses a job file of the repository: {errors}"
    assert _check(text, tmp_path) == 0, f"{where}: config check refuses it: {capsys.readouterr().err}"


BAD = {
    "duration with an unknown unit": '[rendezvous]\njoin_timeout = "10 minutes"\n',
    "zero timeout": '[rendezvous]\njoin_timeout = "0s"\n',
    "zero timeout as a number": "[rendezvous]\njoin_timeout = 0\n",
    "negative duration": "[agent]\nshutdown_timeout = -1\n",
    "duration past a year": "[agent]\nshutdown_timeout = 40000000\n",
    "boolean duration": "[agent]\nexit_barrier_timeout = true\n",
    "unknown section": "[trainer]\nepochs = 3\n",
    "unknown key": "[rendezvous]\njoin_timout = 10\n",
    "wrong type": '[collectives]\ntimeout = ["1s"]\n',
    "underscored number": '[rpc]\ntimeout = "1_000"\n',
    "unknown option of the file backend": (
        '[rendezvous]\nbackend = "file"\n[rendezvous.options]\npoll_intervall = 1\n'
    ),
    "file backend without its required path": '[rendezvous]\nbackend = "file"\n',
    "file backend option out of range": '[rendezvous]\nbackend = "file"\n[rendezvous.options]\npoll_interval = 0\n',
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_job_file_is_refused_by_both(name, validator, tmp_path, capsys) -> None:
    text = BAD[name]
    assert _schema_errors(validator, tomllib.loads(text)), f"the schema accepts a bad job file ({name})"
    assert _check(text, tmp_path) == 2, f"config check accepts a bad job file ({name})"
    assert "job.toml" in capsys.readouterr().err


@pytest.mark.parametrize(
    "value",
    ["250ms", "30s", "5M", "1h30m", " 1m 30s ", "30", "1.5", "+2", "1e3", ".5s", "2d", 45, 0.25],
)
def test_every_duration_form_is_accepted_by_both(value, validator, tmp_path) -> None:
    text = f"[rendezvous]\njoin_timeout = {json.dumps(value)}\n"
    assert not _schema_errors(validator, tomllib.loads(text))
    assert _check(text, tmp_path) == 0


def test_the_getting_started_job_is_one_rallypoint_run_takes(tmp_path, capsys, monkeypatch) -> None:
    """The page says config check's checks run before ``rallypoint run``: its job must pass both (#41)."""
    (block,) = [b for b in blocks("toml") if b.page.name == "getting-started.md" and "[job]" in b.text]
    (tmp_path / "job.toml").write_text(block.text)
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--dry-run", "job.toml"])
    assert code == 0, f"{block.where}: rallypoint run refuses the page's job: {capsys.readouterr().err}"
