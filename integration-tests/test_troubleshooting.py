"""docs/troubleshooting.md stays complete: every error a user can meet has its entry.

The error classes are found in the installed packages (every subclass of ``RallypointError``),
so a new error class without an entry fails here; so does a refused torchrun flag, and each
message of the command line itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rallypoint.agent.torchrun_flags import TORCHRUN_FLAGS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"
PACKAGES = ("rallypoint", "rallypoint_file", "rallypoint_grpc", "rallypoint_etcd", "rallypoint_gloo",
            "rallypoint_nccl", "rallypoint_ranks")  # fmt: skip
#: Messages of the command line itself (rallypoint.core.cli, rallypoint status).
CLI_MESSAGES = (
    "No such option",
    "no such command",
    "internal error",
    "aborted",
    "interrupted",
    "options go before the job file",
    "no rendezvous state",
    "no job found under",  # rallypoint debug stacks of a one-node memory-backend job
    "The system refused a file operation",
)


FIND_CLASSES = """
import importlib, json, pkgutil, sys
from rallypoint.core.errors import RallypointError

for name in sys.argv[1:]:
    package = importlib.import_module(name)
    for module in pkgutil.walk_packages(package.__path__, name + "."):
        if module.name.rsplit(".", 1)[-1] in ("testing", "_proto") or "._proto" in module.name:
            continue
        importlib.import_module(module.name)
found, todo = set(), [RallypointError]
while todo:
    for sub in todo.pop().__subclasses__():
        if sub not in found:
            found.add(sub)
            todo.append(sub)
print(json.dumps(sorted([c.__module__, c.__name__] for c in found)))
"""


def error_classes() -> list[tuple[str, str]]:
    """``(module, name)`` of every ``RallypointError`` subclass, found in a process of its own.

    Importing every module (gRPC's included) in a process of its own keeps this test's process
    free of them (forked children of later tests hang after gRPC was loaded).
    """
    proc = subprocess.run(
        [sys.executable, "-c", FIND_CLASSES, *PACKAGES], capture_output=True, text=True, timeout=300, check=True
    )
    return [tuple(item) for item in json.loads(proc.stdout.splitlines()[-1])]  # type: ignore[misc]


def test_every_error_class_has_an_entry() -> None:
    headings = {line[4:].strip() for line in PAGE.read_text().splitlines() if line.startswith("### ")}
    classes = error_classes()
    assert ("rallypoint.core.errors", "ConfigError") in classes
    missing = [f"{module}.{name}" for module, name in classes if name not in headings]
    assert missing == [], "error classes without a '### Name' entry in docs/troubleshooting.md"


def test_every_refused_flag_and_cli_message_has_an_entry() -> None:
    text = PAGE.read_text()
    refused = [f.name for f in TORCHRUN_FLAGS if f.refused is not None]
    assert refused
    assert [name for name in refused if f"`{name}`" not in text] == []
    assert [m for m in CLI_MESSAGES if m not in text] == []
