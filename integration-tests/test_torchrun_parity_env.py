"""The worker environment under ``rallypoint run`` is torchrun's, variable by variable.

Both launchers run the same tiny script, with the same flags, that dumps ``os.environ``; the
environments are diffed. The only differences allowed are :data:`ALLOWED` (and rallypoint's own
``RALLYPOINT_*`` additions), each listed with its reason in docs/migrating-from-torchrun.md.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DUMP = """
import json, os, sys
with open(os.path.join(sys.argv[1], "env" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump(dict(os.environ), f)
"""
#: Variables whose values may differ, and why (the migration guide lists the same).
ALLOWED = {
    "MASTER_ADDR": "the address of the node that holds global rank 0, not the rendezvous endpoint's host",
    "MASTER_PORT": "a free port on that node, where worker rank 0 serves torch's env:// store",
    "TORCHELASTIC_USE_AGENT_STORE": "False: worker rank 0 serves the store (the agent never imports torch; "
    "True, as torchrun's, when the warm process preloads torch and serves it)",
    "TORCHELASTIC_ERROR_FILE": "absolute in both; rallypoint's lies in the job's log directory",
    "_": "the shell's record of the launcher's path",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(launcher: list[str], tmp_path: Path, name: str) -> list[dict[str, str]]:
    out = tmp_path / name
    out.mkdir()
    flags = ["--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
             "--rdzv-id", "parity", "--max-restarts", "1", "--role", "trainer"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "TORCHELASTIC_", "MASTER_"))}
    proc = subprocess.run(
        [*launcher, *flags, str(tmp_path / "dump.py"), str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads((out / f"env{rank}.json").read_text()) for rank in range(2)]


@pytest.fixture(scope="module")
def environments(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    tmp_path = tmp_path_factory.mktemp("parity")
    (tmp_path / "dump.py").write_text(DUMP)
    theirs = _launch([str(BIN / "torchrun")], tmp_path, "torchrun")
    ours = _launch([str(BIN / "rallypoint"), "run"], tmp_path, "rallypoint")
    return theirs, ours


def test_every_variable_is_torchruns_but_the_allowed_ones(environments) -> None:
    theirs, ours = environments
    for rank in range(2):
        names = (set(theirs[rank]) | set(ours[rank])) - set(ALLOWED)
        differ = {
            n: (theirs[rank].get(n), ours[rank].get(n))
            for n in sorted(names)
            if theirs[rank].get(n) != ours[rank].get(n) and not (n.startswith("RALLYPOINT_") and n not in theirs[rank])
        }
        assert differ == {}, f"rank {rank}: (torchrun, rallypoint) values differ"
        assert ours[rank]["ROLE_NAME"] == "trainer"
        assert "TORCHELASTIC_SIGNALS_TO_HANDLE" in ours[rank]
        assert "OMP_NUM_THREADS" in ours[rank]


def test_the_allowed_differences_are_what_the_guide_says(environments) -> None:
    theirs, ours = environments
    for rank in range(2):
        assert ours[rank]["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert 0 < int(ours[rank]["MASTER_PORT"]) < 65536
        assert ours[rank]["MASTER_ADDR"] == ours[0]["MASTER_ADDR"] != ""
        for env in (theirs[rank], ours[rank]):
            assert os.path.isabs(env["TORCHELASTIC_ERROR_FILE"]), env["TORCHELASTIC_ERROR_FILE"]
    guide = (ROOT / "docs" / "migrating-from-torchrun.md").read_text()
    for name in ALLOWED:
        assert f"`{name}`" in guide, f"{name} is an allowed difference the migration guide does not list"
