"""Every name in the "Where things live" table of docs/architecture.md exists (#37).

The table is how a newcomer finds a feature in one guess; a module renamed or split without the
table following would send them to nothing. Each row's full dotted names (``rallypoint.agent.fence``,
``rallypoint.core.wait_more.WaitMore``) must be a module, or an attribute of one, and each path
(``integration-tests/test_spares.py``) a file; a short name after a full one in the same cell
(``rallypoint.agent.plan``, ``plan_view``) must be a module beside it or inside it, or one of its
attributes.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
TICKED = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"^rallypoint(_[a-z]+)?(\.[A-Za-z_][A-Za-z0-9_]*)+$|^rallypoint_[a-z]+$")
SHORT = re.compile(r"^_?[a-z][a-z0-9_]*$")


def _rows() -> list[tuple[str, str]]:
    text = PAGE.read_text()
    table = text.split("## Where things live", 1)[1].split("\n\n", 2)[1]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 2, line
        rows.append((cells[0], cells[1]))
    return rows


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None  # imports the parent packages only
    except ModuleNotFoundError:
        return False


def _exists(name: str) -> bool:
    """``name`` is a module, or an attribute of one (only then is the module imported)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        if not _is_module(".".join(parts[:cut])):
            continue
        found: object = importlib.import_module(".".join(parts[:cut])) if cut < len(parts) else name
        for attr in parts[cut:]:
            found = getattr(found, attr, None)
        return found is not None
    return False


def _short(anchor: str, name: str) -> bool:
    """``name`` beside, inside or an attribute of what ``anchor`` names."""
    parent = anchor.rpartition(".")[0]
    candidates = [f"{anchor}.{name}", f"{parent}.{name}" if parent else name]
    return any(_exists(c) for c in candidates)


def test_the_table_has_the_features_a_newcomer_looks_for() -> None:
    wanted = ["spares", "heartbeat", "RPC", "watchdog", "warm workers", "hang forensics", "launch environments"]
    firsts = " ".join(first for first, _ in _rows())
    assert [w for w in wanted if w not in firsts] == []


def test_every_name_in_the_table_exists() -> None:
    missing = []
    for what, where in _rows():
        anchor = None
        for name in TICKED.findall(where):
            if name.endswith("/"):  # a folder every subsystem has (plugin_templates/)
                continue
            if "/" in name:
                path = ROOT / name if (ROOT / name).exists() else ROOT / "integration-tests" / name
                if not path.exists():
                    missing.append(f"{what}: {name}")
            elif DOTTED.match(name):
                anchor = name
                if not _exists(name):
                    missing.append(f"{what}: {name}")
            elif anchor is not None and SHORT.match(name) and not _short(anchor, name):
                missing.append(f"{what}: {name} (after {anchor})")
    assert missing == []
