"""torch interop: two torchrun agents rendezvous through ``--rdzv-backend rallypoint-file``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rallypoint.rendezvous.testing import assert_torch_registry_has, run_torchrun_agents


def test_rallypoint_import_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import rallypoint.rendezvous, rallypoint.rendezvous.handler, rallypoint_file.backend, rallypoint_file.hooks\n"
        "from rallypoint.core.plugins import get_plugin_manager\n"
        "from rallypoint.rendezvous.records import RENDEZVOUS_BACKENDS\n"
        "get_plugin_manager().registry(RENDEZVOUS_BACKENDS)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_torch_registry_has_the_handler() -> None:
    assert_torch_registry_has("rallypoint-file")


@pytest.mark.slow
def test_two_torchrun_agents_run_a_job(tmp_path: Path) -> None:
    lines = run_torchrun_agents("rallypoint-file", str(tmp_path / "rdzv"), tmp_path, rdzv_id="X")
    assert lines == ["RESULT rank=0 world=2 sum=3 group=0", "RESULT rank=1 world=2 sum=3 group=1"]
    # The rendezvous state is JSON files, closed at the end (torch's shutdown semantics).
    header = (tmp_path / "rdzv" / "X" / "kv" / "round" / "header").read_text()
    assert '"closed":true' in header.replace(" ", "")
