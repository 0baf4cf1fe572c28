"""The shape the architecture issue set for the sources: short functions, modules of one job.

No function in ``packages/*/src`` or ``plugins/*/src`` is longer than 80 lines, no module longer
than 600 (the conformance kits too: the rendezvous kit is a ``testing/`` package of one module per
job), and no file of core (sources, templates, tests) names a subsystem package: kinds come from
the subsystems (``rallypoint_plugin_kinds``, ``rallypoint_plugin_templates``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("plugins/*/src/**/*.py")])
MAX_FUNCTION, MAX_MODULE = 80, 600
SUBSYSTEMS = ("rendezvous", "agent", "timer", "collectives", "rpc")


def test_the_sources_were_found() -> None:
    assert len(SOURCES) > 50, SOURCES


def test_no_function_longer_than_80_lines_and_no_module_longer_than_600() -> None:
    too_long = []
    for path in SOURCES:
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE:
            too_long.append(f"{path.relative_to(ROOT)}: module of {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert too_long == []


def _naming_a_subsystem(paths: list[Path]) -> list[str]:
    pattern = re.compile(r"rallypoint[._-](?:" + "|".join(SUBSYSTEMS) + r")\b")
    return [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in paths
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


CORE = ROOT / "packages/rallypoint-core"


def test_core_names_no_subsystem() -> None:
    core = [p for p in CORE.glob("**/*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(core) > 40
    assert _naming_a_subsystem(core) == []
