"""The fenced code blocks of the docs (``docs/**/*.md`` and ``README.md``), for the tests that run them.

A block is preceded, optionally, by a marker line (an HTML comment, invisible on the page)::

    <!-- docs-test: skip: REASON -->

which keeps the block out of the tests, with the reason shown where it is listed (a GPU, a real
cluster, a plugin that is only the page's example).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^([ \t]*)```([\w-]*)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
_SKIP = re.compile(r"<!--\s*docs-test:\s*skip:\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and the skip reason if marked."""

    page: Path
    line: int  #: the line of the opening fence (1-based)
    lang: str
    text: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(lang: str) -> list[Block]:
    """Every block of language ``lang`` in the docs, in page order."""
    found = []
    for page in doc_pages():
        source = page.read_text()
        for match in _FENCE.finditer(source):
            if match.group(2) != lang:
                continue
            line = source.count("\n", 0, match.start()) + 1
            before = source[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marked = _SKIP.search(before)
            text = textwrap.dedent(match.group(3))
            found.append(Block(page, line, lang, text, marked.group(1) if marked else None))
    return found
